"""FlashInfer's sampling entry points: the kernel module is JIT-built the first time one is called."""

from __future__ import annotations

import functools

import numpy as np

from pytest_dflash.refserver.fault_site.flashinfer.jit.core import JitModule, JitSpec


def gen_sampling_module() -> JitSpec:
    return JitSpec("sampling", {"top_k_top_p_sampling_from_probs": _top_k_top_p_sampling_from_probs})


@functools.cache
def get_sampling_module() -> JitModule:
    module = gen_sampling_module().build_and_load()
    return module


def top_k_top_p_sampling_from_probs(probs: np.ndarray, top_k: int, top_p: float) -> object:
    return get_sampling_module().top_k_top_p_sampling_from_probs(
        probs, top_k, top_p
    )


def _top_k_top_p_sampling_from_probs(probs: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    # The refserver samples in spec.py; the "kernel" only has to exist once it is built.
    return probs
