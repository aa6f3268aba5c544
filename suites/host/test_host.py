"""Host layer: are the GPUs the profile names there, identified and healthy? Nothing is started.

    pytest --host ct200 suites/host

Evidence: `nvidia-smi --query-gpu ... --format=csv`, `nvidia-smi -q -x`, the compute-apps list and
the kernel log since boot (Xid, "fallen off the bus", OOM killer), all read-only.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from pytest_dflash.layers.gpu import GpuHost
from pytest_dflash.layers.gpu.checks import classify_kernel_lines, gpu_health, xid_codes
from pytest_dflash.layers.gpu.report import explain

pytestmark = pytest.mark.host


class GpuHostWarning(UserWarning):
    """Something on a GPU host worth knowing that does not fail it."""


def _host_access(gpu: GpuHost) -> None:
    if not gpu.host.has_host_access:
        pytest.skip("attached by URL: no host access")


def _gpus(gpu: GpuHost) -> None:
    _host_access(gpu)
    if not gpu.has_gpu:
        pytest.skip(gpu.no_gpu_reason())


def test_nvidia_smi_lists_gpus(dflash_gpu: GpuHost) -> None:
    """nvidia-smi answers and lists GPUs; a host whose profile names GPUs must have them."""
    _host_access(dflash_gpu)
    inventory = dflash_gpu.inventory
    if not inventory.gpus and not dflash_gpu.expected_gpus:
        pytest.skip(dflash_gpu.no_gpu_reason() + " (and its profile names none)")
    raw = dflash_gpu.probe("gpu_inventory")
    evidence = "\n".join(str((raw.get(k) or {}).get("stderr") or "") for k in ("query", "xml")) or str(raw)
    assert inventory.available, explain(
        f"the profile names GPUs {list(dflash_gpu.expected_gpus)} but nvidia-smi did not answer: {inventory.reason}",
        evidence)
    assert inventory.gpus, explain("nvidia-smi answered but lists no GPU", str(raw.get("query")))


def test_profile_gpus_present(dflash_gpu: GpuHost) -> None:
    """Every GPU index named in the profile (host.gpus, services.*.gpus) exists on the host."""
    _gpus(dflash_gpu)
    if not dflash_gpu.expected_gpus:
        pytest.skip("the profile names no GPU indices")
    present = [g.index for g in dflash_gpu.inventory.gpus]
    missing = [index for index in dflash_gpu.expected_gpus if index not in present]
    assert not missing, explain(f"GPUs {missing} named in {dflash_gpu.host.profile.source} are not on the host "
                                f"(nvidia-smi lists {present})",
                                "\n".join(g.label for g in dflash_gpu.inventory.gpus))


def test_gpu_identity_reported(dflash_gpu: GpuHost) -> None:
    """Name, compute capability, driver and memory are known for every GPU (recorded in the verdict)."""
    _gpus(dflash_gpu)
    inventory = dflash_gpu.inventory
    dflash_gpu.export("gpus", {
        "driver": inventory.driver, "driver_cuda": inventory.driver_cuda,
        "gpus": [dataclasses.asdict(g) for g in inventory.gpus],  # processes on each GPU included
    })
    incomplete = [g.label for g in inventory.gpus
                  if not g.name or g.capability is None or not g.driver or not g.memory_total_mib]
    assert not incomplete, explain(f"nvidia-smi does not report name / compute_cap / driver / memory for "
                                   f"{incomplete} (compute_cap needs driver >= 510)",
                                   str(dflash_gpu.probe("gpu_inventory").get("query")))
    off = [g.label for g in inventory.gpus if g.persistence is False]
    if off:
        warnings.warn(GpuHostWarning(f"{dflash_gpu.host.name}: persistence mode is off on {off}: the first CUDA "
                                     "call after idle re-initialises the driver (nvidia-smi -pm 1)"), stacklevel=1)


def test_gpu_memory_healthy(dflash_gpu: GpuHost) -> None:
    """No uncorrectable ECC errors, no pages pending retirement, no pending or failed row remapping."""
    _gpus(dflash_gpu)
    problems = [p for g in dflash_gpu.inventory.gpus for p in gpu_health(g)]
    assert not problems, explain("GPU memory is not healthy", "\n".join(problems))


def test_service_gpus_not_held_by_other_processes(dflash_gpu: GpuHost) -> None:
    """Before provisioning starts services, no other process holds memory on their GPUs.

    A second process allocating while SGLang sizes its KV cache is charged to SGLang (recorded S4e).
    """
    _gpus(dflash_gpu)
    if not dflash_gpu.host.provisioning:
        pytest.skip("attach mode: the running services hold their own GPUs")
    wanted = {i for spec in dflash_gpu.host.profile.services.values() for i in spec.gpus}
    busy = [f"{g.label}: pid {p.pid} {p.name} ({p.used_mib or '?'} MiB)"
            for g in dflash_gpu.inventory.gpus if not wanted or g.index in wanted for p in g.processes]
    assert not busy, explain("other processes hold the services' GPUs before they start", "\n".join(busy))


def _kernel_lines(gpu: GpuHost) -> list[str]:
    _host_access(gpu)
    log = gpu.kernel_log()
    if "transport_error" in log:
        pytest.fail(explain("the kernel-log probe could not run", log["transport_error"]), pytrace=False)
    if not log.get("readable"):
        tried = "; ".join(f"{' '.join(a['argv'][:2])}: rc {a['rc']} {a['stderr'][:200]}" for a in log["attempts"])
        pytest.skip(f"the kernel log is not readable on {gpu.host.name} ({tried})")
    lines: list[str] = log.get("matches", [])
    return lines


def test_kernel_log_has_no_gpu_faults(dflash_gpu: GpuHost) -> None:
    """No Xid errors and no GPU "fallen off the bus" since boot."""
    found = classify_kernel_lines(_kernel_lines(dflash_gpu))
    faults = found.get("gpu-fallen-off-bus", []) + found.get("gpu-xid", [])
    codes = sorted({code for _, code in xid_codes(faults)})
    assert not faults, explain(f"the kernel log reports GPU faults since boot (Xid codes {codes})", "\n".join(faults))


def test_kernel_log_has_no_oom_kills(dflash_gpu: GpuHost) -> None:
    """The kernel OOM killer has not killed anything since boot."""
    kills = classify_kernel_lines(_kernel_lines(dflash_gpu)).get("oom-killer", [])
    assert not kills, explain("the kernel OOM killer fired since boot", "\n".join(kills))
