"""Kernels layer: do the JIT kernels build on a COLD cache and compute right on this GPU?

    pytest --host ct200 suites/kernels --provision        # or, attached to running services: --allow-gpu-use

Each build runs in an empty temporary FLASHINFER_WORKSPACE_BASE (removed afterwards) with the
service's own environment: a warm cache cannot hide a broken toolchain (seed 004). On a host without
a GPU only the compile (+ link) step runs, for --jit-arch-list (default 9.0); the checks that need
a GPU skip and say so. In attach mode these tests skip unless --allow-gpu-use lets them share the
host's GPUs with its running services.
"""

from __future__ import annotations

import pytest

from pytest_dflash.api import (
    GpuHost,
    builds_cold,
    decode_attention_matches_sdpa,
    sampling_respects_top_k_top_p,
    service_does_not_rely_on_warm_jit_cache,
    triton_kernel_compiles_and_runs,
)

pytestmark = [pytest.mark.kernels, pytest.mark.timeout(3600)]


def test_flashinfer_sampling_builds_cold(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """FlashInfer's sampling module (sampling.cu, renorm.cu, binding) compiles and links from an empty
    cache."""
    builds_cold(dflash_gpu, "sampling", request)


def test_flashinfer_sampling_respects_top_k_top_p(dflash_gpu: GpuHost,
                                                  request: pytest.FixtureRequest) -> None:
    """top_k_top_p_sampling_from_probs draws only from the top-k then top-p set, with its frequencies."""
    sampling_respects_top_k_top_p(dflash_gpu, request)


def test_flashinfer_decode_attention_builds_cold(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """FlashInfer's single-decode attention module (fp16, head_dim 128) compiles and links from an empty
    cache."""
    builds_cold(dflash_gpu, "decode", request)


def test_flashinfer_decode_attention_matches_sdpa(dflash_gpu: GpuHost,
                                                  request: pytest.FixtureRequest) -> None:
    """single_decode_with_kv_cache (GQA 32/8 heads, 1024 tokens) equals torch scaled_dot_product_attention."""
    decode_attention_matches_sdpa(dflash_gpu, request)


def test_triton_kernel_compiles_and_runs(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """A Triton kernel compiles into an empty cache and computes x * 2 + y like torch."""
    triton_kernel_compiles_and_runs(dflash_gpu, request)


def test_service_does_not_rely_on_warm_jit_cache(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """The service's real FlashInfer cache holds no module for this GPU that a cold build cannot produce.

    A warm cache keeps a service with a broken toolchain alive until a reboot, upgrade or new host
    (seed 004: healthy for weeks, dead on the first sampled request after the cache was gone).
    """
    service_does_not_rely_on_warm_jit_cache(dflash_gpu, request)
