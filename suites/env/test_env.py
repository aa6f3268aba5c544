"""Env layer: can the server's venv run its serving stack on this host's GPUs? Nothing is started.

    pytest --host ct200 suites/env
    pytest --host ct200 suites/env --env-baseline known-good.json

Every probe runs with the profile's python (the server's venv) and each service's own environment
(unit Environment= lines / profile env), so PYTHONPATH overlays and CUDA_HOME are the service's.
"""

from __future__ import annotations

import pytest

from pytest_dflash.api import (
    ALL_CHAINS,
    GpuHost,
    driver_supports_torch_cuda,
    flashinfer_companions_match,
    flashinfer_toolkit_supports_gpu_arch,
    import_chain,
    installed_versions_satisfy_requirements,
    jit_link_finds_cuda_libraries,
    ninja_on_service_path,
    pip_check_clean_for_serving_stack,
    service_flags_exist_in_installed_sglang,
    service_gpus_match_parallelism,
    service_python_is_the_profiles,
    serving_stack_matches_baseline,
    sgl_kernel_has_build_for_gpu_arch,
    toolkit_has_curand_headers,
    torch_arch_list_covers_gpus,
    torch_imports,
    torch_initialises_cuda,
)

pytestmark = pytest.mark.env


def test_service_python_is_the_profiles(dflash_gpu: GpuHost) -> None:
    """The probes run the profile's python; a service that runs another interpreter would not be the one
    probed."""
    service_python_is_the_profiles(dflash_gpu)


def test_service_gpus_match_parallelism(dflash_gpu: GpuHost) -> None:
    """Each service's `gpus`, its CUDA_VISIBLE_DEVICES and its command's --tp-size / --dp-size / --pp-size
    agree: a TP service gets exactly the GPUs its ranks take."""
    service_gpus_match_parallelism(dflash_gpu)


def test_torch_imports(dflash_gpu: GpuHost) -> None:
    """torch imports in the server's venv (an undefined symbol here is a broken torch/CUDA overlay)."""
    torch_imports(dflash_gpu)


def test_torch_initialises_cuda(dflash_gpu: GpuHost) -> None:
    """On a GPU host, torch is a CUDA build and initialises CUDA (driver new enough, devices visible)."""
    torch_initialises_cuda(dflash_gpu)


def test_torch_arch_list_covers_gpus(dflash_gpu: GpuHost) -> None:
    """torch.cuda.get_arch_list() has SASS for, or a lower-or-equal PTX of, every GPU's compute capability."""
    torch_arch_list_covers_gpus(dflash_gpu)


def test_driver_supports_torch_cuda(dflash_gpu: GpuHost) -> None:
    """The NVIDIA driver is new enough for the CUDA release torch was built with."""
    driver_supports_torch_cuda(dflash_gpu)


@pytest.mark.parametrize("chain", ALL_CHAINS)
def test_import_chain(dflash_gpu: GpuHost, chain: str) -> None:
    """The serving chain imports in a fresh interpreter of the server's venv, in the service's environment."""
    import_chain(dflash_gpu, chain)


def test_installed_versions_satisfy_requirements(dflash_gpu: GpuHost) -> None:
    """Requires-Dist pins of sglang, sglang-kernel, flashinfer, torch, xgrammar hold for the serving stack."""
    installed_versions_satisfy_requirements(dflash_gpu)


def test_service_flags_exist_in_installed_sglang(dflash_gpu: GpuHost) -> None:
    """Each SGLang service's command uses only flags the installed sglang still has; a removed (renamed) flag
    is named with its replacement before the server starts (docs/sglang-versions.md)."""
    service_flags_exist_in_installed_sglang(dflash_gpu)


def test_pip_check_clean_for_serving_stack(dflash_gpu: GpuHost) -> None:
    """`pip check` reports no version conflict that involves a serving-stack package."""
    pip_check_clean_for_serving_stack(dflash_gpu)


def test_flashinfer_companions_match(dflash_gpu: GpuHost) -> None:
    """flashinfer-cubin and flashinfer-jit-cache, when installed, match flashinfer-python's version."""
    flashinfer_companions_match(dflash_gpu)


def test_flashinfer_toolkit_supports_gpu_arch(dflash_gpu: GpuHost) -> None:
    """The CUDA toolkit FlashInfer's JIT resolves (CUDA_HOME, `which nvcc`, /usr/local/cuda) can target every
    GPU.

    FlashInfer <= 0.7.0 needs nvcc >= 12.9 for any SM 12.x GPU and otherwise drops the GPU and fails
    with the misleading "FlashInfer requires GPUs with sm75 or higher" (seed 000/004).
    """
    flashinfer_toolkit_supports_gpu_arch(dflash_gpu)


def test_toolkit_has_curand_headers(dflash_gpu: GpuHost) -> None:
    """curand.h / curand_kernel.h are on the JIT's include path (sampling and norm kernels include them)."""
    toolkit_has_curand_headers(dflash_gpu)


def test_jit_link_finds_cuda_libraries(dflash_gpu: GpuHost) -> None:
    """The JIT link (`-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda`) finds both libraries."""
    jit_link_finds_cuda_libraries(dflash_gpu)


def test_ninja_on_service_path(dflash_gpu: GpuHost) -> None:
    """FlashInfer's JIT runs `ninja` from PATH; the service's PATH must have it."""
    ninja_on_service_path(dflash_gpu)


def test_sgl_kernel_has_build_for_gpu_arch(dflash_gpu: GpuHost) -> None:
    """sglang-kernel ships the common_ops build this GPU loads (sm90 on compute 9.0, sm100 otherwise)."""
    sgl_kernel_has_build_for_gpu_arch(dflash_gpu)


def test_serving_stack_matches_baseline(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """With --env-baseline: torch, sglang, sglang-kernel, flashinfer*, xgrammar, transformers, triton,
    nvidia-* CUDA libraries and the driver equal the known-good snapshot. Always records this host's
    snapshot."""
    serving_stack_matches_baseline(dflash_gpu, request)
