"""Host layer: are the GPUs the profile names there, identified and healthy? Nothing is started.

    pytest --host ct200 suites/host

Evidence: `nvidia-smi --query-gpu ... --format=csv`, `nvidia-smi -q -x`, the compute-apps list and
the kernel log since boot (Xid, "fallen off the bus", OOM killer), all read-only.
"""

from __future__ import annotations

import pytest

from pytest_dflash.api import (
    GpuHost,
    gpu_identity_reported,
    gpu_memory_healthy,
    kernel_log_has_no_gpu_faults,
    kernel_log_has_no_oom_kills,
    nvidia_smi_lists_gpus,
    profile_gpus_present,
    service_gpus_not_held_by_other_processes,
)

pytestmark = pytest.mark.host


def test_nvidia_smi_lists_gpus(dflash_gpu: GpuHost) -> None:
    """nvidia-smi answers and lists GPUs; a host whose profile names GPUs must have them."""
    nvidia_smi_lists_gpus(dflash_gpu)


def test_profile_gpus_present(dflash_gpu: GpuHost) -> None:
    """Every GPU index named in the profile (host.gpus, services.*.gpus) exists on the host."""
    profile_gpus_present(dflash_gpu)


def test_gpu_identity_reported(dflash_gpu: GpuHost) -> None:
    """Name, compute capability, driver and memory are known for every GPU (recorded in the verdict)."""
    gpu_identity_reported(dflash_gpu)


def test_gpu_memory_healthy(dflash_gpu: GpuHost) -> None:
    """No uncorrectable ECC errors, no pages pending retirement, no pending or failed row remapping."""
    gpu_memory_healthy(dflash_gpu)


def test_service_gpus_not_held_by_other_processes(dflash_gpu: GpuHost) -> None:
    """Before provisioning starts services, no other process holds memory on their GPUs.

    A second process allocating while SGLang sizes its KV cache is charged to SGLang (recorded S4e).
    """
    service_gpus_not_held_by_other_processes(dflash_gpu)


def test_kernel_log_has_no_gpu_faults(dflash_gpu: GpuHost) -> None:
    """No Xid errors and no GPU "fallen off the bus" since boot."""
    kernel_log_has_no_gpu_faults(dflash_gpu)


def test_kernel_log_has_no_oom_kills(dflash_gpu: GpuHost) -> None:
    """The kernel OOM killer has not killed anything since boot."""
    kernel_log_has_no_oom_kills(dflash_gpu)
