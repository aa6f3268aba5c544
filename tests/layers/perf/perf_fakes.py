"""Synthetic load results for the perf layer's unit tests (no server: every number is set here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.load import (
    ErrorKind,
    LoadResult,
    LoadSpec,
    RequestError,
    RequestRecord,
    Saturation,
    aggregate,
)


def fake_result(*, n: int = 40, tokens: int = 32, e2e_ms: float = 100.0, ttft_ms: float = 40.0, verify: int | None = 7,
                concurrency: int = 1, failed: int = 0, saturated: bool = False, server_accept: float | None = None,
                seed: int = 0, spec: Mapping[str, Any] | None = None) -> LoadResult:
    """n closed-loop requests whose e2e latency varies by ~5 % around e2e_ms (throughput ≈ tokens/e2e · concurrency)."""
    rng = np.random.default_rng(seed)
    records: list[RequestRecord] = []
    clock = [0.0] * concurrency
    for i in range(n + failed):
        slot = i % concurrency
        e2e = float(e2e_ms * (1 + 0.05 * rng.standard_normal()))
        start = clock[slot]
        clock[slot] = start + e2e / 1000
        if i >= n:
            records.append(RequestRecord(index=i, start_s=start, end_s=start + 0.001, max_tokens=tokens,
                                         error=RequestError(ErrorKind.TIMEOUT, "no token within 120 s")))
            continue
        gap = (e2e - ttft_ms) / max(tokens - 1, 1)
        records.append(RequestRecord(
            index=i, prompt_len=32, max_tokens=tokens, start_s=start, end_s=start + e2e / 1000, ttft_ms=ttft_ms,
            itl_ms=[gap * float(1 + 0.1 * rng.standard_normal()) for _ in range(tokens - 1)], e2e_ms=e2e,
            output_tokens=tokens, prompt_tokens=32, finish_reason="length",
            verify_ct=verify, accept_length=(tokens / verify) if verify else None))
    metrics, errors = aggregate(records, max_concurrency=concurrency, server_accept_length=server_accept)
    load = LoadSpec(endpoint="generate", concurrency=concurrency, num_requests=n, prompt_len=32, output_len=tokens,
                    **dict(spec or {}))
    sat = Saturation(saturated=saturated, reasons=["event-loop lag p99 80.0 ms > 5 ms"] if saturated else [])
    return LoadResult(spec=load, base_url="http://127.0.0.1:1", records=records, metrics=metrics, errors_by_kind=errors,
                      saturation=sat, server_accept_length=server_accept)


def fake_run(service: str = "dflash", algorithm: str = "DFLASH", **kwargs: Any) -> ServiceRun:
    return ServiceRun(host="gpu-a", service=service, algorithm=algorithm, settings=PerfSettings(concurrency=1),
                      result=fake_result(**kwargs))
