"""--gpu-step-ms: speculative decoding must pay off the way it does on a GPU, and slow-decode must cut it."""

from __future__ import annotations

import time

import httpx

from pytest_dflash.refserver.cost_model import gpu_step_seconds
from pytest_dflash.refserver.launch import RefServerProcess


def tokens_per_second(*args: str) -> tuple[float, float]:
    with RefServerProcess(*args, "--gpu-step-ms", "20") as server, httpx.Client(base_url=server.url, timeout=60) as c:
        body = {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 48, "temperature": 0,
                                                                    "ignore_eos": True}}
        c.post("/generate", json=body)  # warm
        # best of three: a busy machine can only slow a run down (the floors are sleeps), so the fastest is the
        # cost model's (CI once read DFLASH at 129 tok/s against ~200 and slow-decode at 70: not half)
        rates = []
        for _ in range(3):
            started = time.monotonic()
            meta = c.post("/generate", json=body).json()["meta_info"]
            rates.append(meta["completion_tokens"] / (time.monotonic() - started))
        return max(rates), float(meta.get("spec_accept_length") or 1.0)


def test_floor_per_iteration() -> None:
    assert gpu_step_seconds(0, None, "DFLASH") == 0
    assert gpu_step_seconds(8, None, "NONE") == 0.008
    assert gpu_step_seconds(8, None, "DDTREE") == 0.009
    assert gpu_step_seconds(8, 2, "DFLASH") == 0.010


def test_speculation_speeds_up_by_about_its_accept_length_and_slow_decode_slows_it() -> None:
    none, _ = tokens_per_second("--speculative-algorithm", "NONE")
    dflash, accept = tokens_per_second("--speculative-algorithm", "DFLASH")
    slow, _ = tokens_per_second("--speculative-algorithm", "DFLASH", "--inject", "slow-decode=3")
    assert none < 1000 / 20 * 1.05  # at most one token per 20 ms step
    assert dflash > 2.0 * none, (none, dflash, accept)
    assert dflash < accept * none * 1.2, (none, dflash, accept)  # bounded by the accept length (draft costs too)
    assert slow < dflash / 2, (dflash, slow)
