"""After a request ran out of time: does the engine still make progress (far too slow) or none at all (stuck)?
Asked of real refserver processes with the faults that copy both (`wedge`, `token-delay`), with and without
/metrics (issue 24, item 4); and what later SGLang releases change (issue 25 item 5): the health bypass
(0.5.19+) that makes /health_generate answer 200 on a wedged engine, and GET /ready (0.5.20+) naming a paused
server."""

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
from pytest_dflash.services.health import BYPASS_ENV, health_bypass
from pytest_dflash.services.stuck import PROGRESS_HEALTH_S, engine_progress, judge_lost_request, metric_values

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


BYPASS = {BYPASS_ENV: "1"}
WHY = health_bypass(BYPASS, where="the profile's env of h/sick")


@pytest.mark.parametrize("metrics", [True, False], ids=["with-metrics", "without-metrics"])
def test_with_the_health_bypass_a_wedged_engine_is_still_stuck(metrics: bool) -> None:
    """SGLang 0.5.19+ with SGLANG_DIAG_BYPASS_HEALTH_GENERATE=1: /health_generate answers 200 on a wedged engine.
    Told so, the check does not ask it: /metrics and the streamed probe say stuck."""
    args = ["--mimic-version", "0.5.19", "--inject", "wedge=1", *(["--enable-metrics"] if metrics else [])]
    with RefServerProcess(*args, env=BYPASS) as server, client(server.url) as http:
        http.generate("Hi")  # the one request it serves
        with pytest.raises(DeadlineExceeded):
            http.generate("Hi")
        assert http.health_generate(timeout_s=2) == 200  # the bypass: 200 without a generation
        fooled = engine_progress(http, native=True, request_timeout_s=TIMEOUT_S)  # not told: fooled
        progress = engine_progress(http, native=True, request_timeout_s=TIMEOUT_S, health_bypassed=WHY)
    assert fooled.moving is True and "/health_generate answered 200" in fooled.describe(), fooled
    assert progress.moving is False, progress
    assert progress.evidence[0] == (f"/health_generate not asked: {WHY}, so its 200 would not mean output got "
                                    "through")
    if metrics:  # counters frozen while requests run: stuck on /metrics alone, no probe needed
        assert not any("streamed probe" in e for e in progress.evidence), progress.evidence
    else:  # no /metrics: the streamed probe stands in for /health_generate, and gets nothing
        assert progress.evidence[-1] == ("a 2s streamed probe got HTTP 200, 0 bytes in 0 SSE events, no token at "
                                         "all: the stream never carried a token (in place of /health_generate)"
                                         ), progress.evidence


def test_with_the_health_bypass_one_lost_request_on_a_fast_engine_is_not_stuck() -> None:
    with RefServerProcess("--mimic-version", "0.5.19", "--inject", "hang=1", env=BYPASS) as server, \
            client(server.url) as http:
        with pytest.raises(DeadlineExceeded) as caught:
            http.generate("Hi")
        stuck, said = judge_lost_request(http, caught.value, label="h/sick", native=True,
                                         request_timeout_s=TIMEOUT_S, health_bypassed=WHY)
    assert stuck is None, said
    assert "the engine still makes progress" in said and "(in place of /health_generate)" in said


@pytest.mark.parametrize(("version", "kind"), [("0.5.23", "paused"), ("0.5.21", "paused or unhealthy")])
def test_a_paused_server_is_named_paused_not_stuck(version: str, kind: str) -> None:
    """POST /pause_generation (0.5.20+ says it on GET /ready; 0.5.23+ tells it from ill health on GET /ping)."""
    with RefServerProcess("--mimic-version", version, "--enable-metrics") as server, client(server.url) as http:
        assert http.request("POST", "/pause_generation", json_body={"mode": "in_place"}).status_code == 200
        with pytest.raises(DeadlineExceeded) as caught:
            http.generate("Hi")
        stuck, said = judge_lost_request(http, caught.value, label="h/paused", native=True,
                                         request_timeout_s=TIMEOUT_S, version=version)
    assert stuck is not None and stuck.kind == kind, said
    assert str(stuck).startswith(f"service h/paused is {kind} (GET /ready 503): POST /generate not answered "
                                 "within 2.00s"), str(stuck)
    assert ("GET /ready: 503 while GET /ping: 200" if version == "0.5.23" else "GET /ready: 503 (not taking new "
            "requests: paused") in said


def test_a_wedged_0_5_23_engine_is_stuck_with_ready_200() -> None:
    """/ready is asked first: the wedge alone leaves it 200 (up, not paused), so the engine is stuck."""
    with RefServerProcess("--mimic-version", "0.5.23", "--inject", "wedge=1") as server, client(server.url) as http:
        http.generate("Hi")
        with pytest.raises(DeadlineExceeded) as caught:
            http.generate("Hi")
        stuck, said = judge_lost_request(http, caught.value, label="h/sick", native=True,
                                         request_timeout_s=TIMEOUT_S, version="0.5.23")
    assert stuck is not None and stuck.kind == "stuck", said
    assert said.startswith("the engine makes no progress at all (GET /ready: 200 (up, healthy and not paused")
