"""After a request ran out of time: does the engine still make progress (far too slow) or none at all (stuck)?
Asked of real refserver processes with the faults that copy both (`wedge`, `token-delay`), with and without
/metrics (issue 24, item 4)."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from pytest_dflash.client.deadline import DeadlineExceeded
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.services.stuck import PROGRESS_HEALTH_S, engine_progress, metric_values

TIMEOUT_S = 2.0


def client(url: str) -> InferenceClient:
    return InferenceClient(url, service="sick", timeout=httpx.Timeout(TIMEOUT_S, connect=2.0))


@pytest.mark.parametrize("metrics", [True, False], ids=["with-metrics", "without-metrics"])
def test_a_wedged_engine_is_stuck(metrics: bool) -> None:
    args = ["--inject", "wedge=1", *(["--enable-metrics"] if metrics else [])]
    with RefServerProcess(*args) as server, client(server.url) as http:
        http.generate("Hi")  # the one request it serves
        with pytest.raises(DeadlineExceeded, match="no complete answer within 2s"):
            http.generate("Hi")  # the HTTP process takes it; the scheduler never steps it
        assert http.models() and http.server_info()  # the HTTP layer still answers
        started = time.monotonic()
        progress = engine_progress(http, native=True, request_timeout_s=TIMEOUT_S)
        took = time.monotonic() - started
    assert progress.moving is False, progress
    assert "the engine makes no progress at all" in progress.describe()
    assert any("/health_generate: no answer within 2s" in e for e in progress.evidence), progress.evidence
    if metrics:
        # the stuck request (and the check's own /health_generate request) still running or queued
        assert any(re.search(r"generation_tokens_total \+0, .*; [1-9]\d* requests running or queued", e)
                   for e in progress.evidence), progress.evidence
    assert took < min(PROGRESS_HEALTH_S, TIMEOUT_S) + 3.0, f"{took:.1f}s: the check is bounded"


def test_a_slow_engine_still_makes_progress() -> None:
    with RefServerProcess("--inject", "token-delay=0.5", "--enable-metrics") as server, client(server.url) as http:
        with pytest.raises(DeadlineExceeded) as caught:
            http.generate_stream("Hi", Sampling(max_tokens=32))
        assert caught.value.tokens is not None and 2 <= caught.value.tokens <= 6, caught.value
        assert caught.value.per_token_s is not None and 0.4 <= caught.value.per_token_s <= 0.8, caught.value
        busy = threading.Thread(target=lambda: http.request("POST", "/generate", timeout_s=10, json_body={
            "text": "Hi", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}), daemon=True)
        busy.start()  # a request that finishes meanwhile: the counters move
        progress = engine_progress(http, native=True, request_timeout_s=TIMEOUT_S, measure_pace=True)
        busy.join(15)
    assert progress.moving is True, progress
    assert "the engine still makes progress" in progress.describe()
    assert any("/health_generate answered 200" in e for e in progress.evidence), progress.evidence
    # the pace of a short streamed probe: what a request that was not streamed cannot say about itself
    assert progress.per_token_s is not None and 0.4 <= progress.per_token_s <= 0.8, progress
    assert any("s per token" in e for e in progress.evidence), progress.evidence


def test_one_lost_request_on_a_fast_engine_is_not_a_slow_engine() -> None:
    with RefServerProcess("--inject", "hang=1", "--enable-metrics") as server, client(server.url) as http:
        with pytest.raises(DeadlineExceeded):
            http.generate("Hi")  # admitted and never stepped; everyone else is served
        progress = engine_progress(http, native=True, request_timeout_s=TIMEOUT_S, measure_pace=True)
    assert progress.moving is True and progress.fast, progress
    assert progress.per_token_s is None, progress
    assert any("a streamed probe of 32 tokens finished in" in e for e in progress.evidence), progress.evidence


def test_metric_values_sum_label_sets() -> None:
    text = ('# HELP sglang:generation_tokens_total x\n'
            'sglang:generation_tokens_total{is_streaming="false"} 12.0\n'
            'sglang:generation_tokens_total{is_streaming="true"} 3.0\n'
            'sglang:num_running_reqs{tp_rank="0"} 2.0\nsglang:other 9\n')
    assert metric_values(text, ("sglang:generation_tokens_total", "sglang:num_running_reqs")) == {
        "sglang:generation_tokens_total": 15.0, "sglang:num_running_reqs": 2.0}
