"""Readiness of a service reached only by URL: death and silence read over HTTP, with no process to ask.

Each case runs the real ReadinessWatcher against real servers on 127.0.0.1: refserver processes with
their faults, a proxy in front of one, a socket that never answers. "Not up yet" must keep waiting;
"was up and is gone" must end the wait within 2 s, naming the request that killed the server.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import httpx
import pytest
from http_doubles import FaultProxy, Reply, SilentServer, sampled_500

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.errors import ServiceGone, ServiceNotReady
from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.services.external import ExternalService
from pytest_dflash.services.health import BYPASS_ENV, health_bypass
from pytest_dflash.services.liveness import HttpLiveness
from pytest_dflash.services.readiness import ReadinessWatcher

SAMPLED_REQUEST = "POST /generate (max_new_tokens 8, temperature 0.8, top_p 0.9, top_k 20)"
GREEDY_REQUEST = "POST /generate (max_new_tokens 8, temperature 0.0)"


def watcher(url: str, *, budget_s: float = 60.0, sampled_s: float = 60.0, request_timeout_s: float = 5.0,
            progress: list[str] | None = None, health_bypassed: str | None = None) -> ReadinessWatcher:
    spec = ServiceSpec(name="svc", kind="external", url=url, algorithm="NONE")
    client = InferenceClient(url, service="svc", timeout=httpx.Timeout(request_timeout_s, connect=5.0))
    return ReadinessWatcher(ExternalService(spec), client, native=None, budget_s=budget_s,
                            sampled_budget_s=sampled_s, request_timeout_s=request_timeout_s,
                            progress=progress.append if progress is not None else None,
                            health_bypassed=health_bypassed)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def record_exit(server: RefServerProcess, seen: dict[str, float]) -> None:
    """Record in `seen["died"]` when the server process exits (time.monotonic()), from a thread."""
    def wait() -> None:
        server.wait_exit(120)
        seen["died"] = time.monotonic()
    threading.Thread(target=wait, name="exit-clock", daemon=True).start()


# ---- healthy: not up yet is no failure ------------------------------------------------------------

def test_a_healthy_attached_server_is_ready_by_real_generations(refserver: RefServerProcess) -> None:
    report = watcher(refserver.url).wait()
    assert report.greedy_s is not None and report.sampled_s is not None
    assert report.total_s < 5


def test_each_phase_starts_as_soon_as_the_last_one_passed(refserver: RefServerProcess) -> None:
    """The poll interval paces retries, not progress: once GET /v1/models answers, the warm-up and the
    generations follow at once (each URL-attached service of a fleet paid a poll, 0.25 s, for nothing)."""
    slow = watcher(refserver.url)
    slow.poll_s = 30.0
    started = time.monotonic()
    report = slow.wait()
    assert report.sampled_s is not None and time.monotonic() - started < 10


def test_connection_refused_from_the_start_is_not_up_yet() -> None:
    port = free_port()
    outcome: dict[str, object] = {}
    w = watcher(f"http://127.0.0.1:{port}", budget_s=60)
    thread = threading.Thread(target=lambda: outcome.setdefault("report", w.wait()), daemon=True)
    thread.start()
    time.sleep(2.0)  # two seconds of refused connections: still waiting, not "gone"
    assert thread.is_alive() and not outcome
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--port", str(port), wait_ready=False):
        thread.join(timeout=60)
        assert not thread.is_alive(), "the watcher did not see the server come up"
    assert outcome["report"].sampled_s is not None  # type: ignore[attr-defined]


def test_refused_until_the_budget_says_so_and_never_gone() -> None:
    started = time.monotonic()
    with pytest.raises(ServiceNotReady) as caught:
        watcher(f"http://127.0.0.1:{free_port()}", budget_s=1.5).wait()
    assert time.monotonic() - started >= 1.5
    assert "http phase" in str(caught.value) and "refused" in str(caught.value)


def test_health_generate_503_during_warm_up_is_waited_for() -> None:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "slow-load=4", wait_ready=False) as server:
        server.wait_port(30)
        assert server.get_status("/health_generate") == 503
        report = watcher(server.url, request_timeout_s=3).wait()  # warm-up (4 s) is longer than a request may be
    assert report.http_s is not None and report.greedy_s is not None
    assert report.greedy_s - report.http_s > 2  # the greedy request went out after the warm-up


def test_a_cold_jit_gets_the_sampled_budget_while_the_server_answers_http() -> None:
    # The first sampled request blocks the scheduler 4 s (/health_generate: 503 after 1 s meanwhile):
    # longer than the request timeout, within the cold-JIT budget.
    env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "cold-jit=4", env=env) as server:
        report = watcher(server.url, request_timeout_s=1.5, sampled_s=30).wait()
    assert report.sampled_request_s is not None and report.sampled_request_s > 3


# ---- was up and is gone ---------------------------------------------------------------------------

def test_death_on_the_first_sampled_request_is_conclusive_within_2s() -> None:
    seen: dict[str, float] = {}
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "flashinfer-sm120=2") as server:
        record_exit(server, seen)
        with pytest.raises(ServiceGone) as caught:
            watcher(server.url).wait()
        raised = time.monotonic()
        server.wait_exit(10)
    deadline = time.monotonic() + 5
    while "died" not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert raised - seen["died"] < 2.0
    text = str(caught.value)
    # the client sees the drop, then the probe the refusal; under load the probe can see the refusal first
    assert (f"{SAMPLED_REQUEST} killed it: no HTTP response (connection dropped), then connections refused" in text
            or f"{SAMPLED_REQUEST} killed it: connections refused while it was in flight" in text), text
    assert "during readiness: first sampled generation" in text and "seen over HTTP" in text
    assert caught.value.request == SAMPLED_REQUEST


def test_a_server_killed_with_the_greedy_request_in_flight_is_gone_at_once() -> None:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "hang=1") as server:
        def kill() -> None:
            time.sleep(1.5)
            server.signal(signal.SIGKILL)
        threading.Thread(target=kill, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(ServiceGone) as caught:
            watcher(server.url, request_timeout_s=30).wait()
    assert time.monotonic() - started < 1.5 + 2.0
    assert caught.value.request == GREEDY_REQUEST and "greedy generation" in str(caught.value)


def test_refused_after_it_had_answered_is_gone_not_not_up_yet() -> None:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "slow-load=30", wait_ready=False) as server:
        server.wait_port(30)
        def kill() -> None:
            time.sleep(1.5)
            server.signal(signal.SIGKILL)
        threading.Thread(target=kill, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(ServiceGone) as caught:
            watcher(server.url).wait()  # in the warm-up: /health_generate 503, then nothing listens
    assert time.monotonic() - started < 1.5 + 2.0
    assert "is gone during readiness: waiting for /health_generate" in str(caught.value)


# ---- accepted and not answered --------------------------------------------------------------------

def test_a_greedy_request_never_answered_fails_at_the_request_timeout() -> None:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "hang=1") as server:
        started = time.monotonic()
        with pytest.raises(ServiceNotReady) as caught:
            watcher(server.url, request_timeout_s=3, sampled_s=120).wait()
        took = time.monotonic() - started
        assert server.returncode is None  # alive and serving others: silence, not death
    assert 3 <= took < 6
    assert (f"greedy phase: {GREEDY_REQUEST} accepted and not answered for 3" in str(caught.value)
            and "(--request-timeout 3s); the server still answers HTTP" in str(caught.value)), str(caught.value)


def test_a_stuck_sampled_request_is_not_a_jit_when_the_scheduler_answers() -> None:
    # hang=2: the sampled request is admitted and never stepped while /health_generate stays 200.
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "hang=2") as server:
        started = time.monotonic()
        with pytest.raises(ServiceNotReady) as caught:
            watcher(server.url, request_timeout_s=2, sampled_s=120).wait()
    assert time.monotonic() - started < 15  # not the 120 s cold-JIT budget
    assert "/health_generate answers 200: the scheduler is free, so this is not a JIT" in str(caught.value)


def test_a_cold_jit_longer_than_its_budget_fails_naming_the_budget() -> None:
    env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "cold-jit=5", env=env) as server:
        started = time.monotonic()
        with pytest.raises(ServiceNotReady) as caught:
            watcher(server.url, request_timeout_s=1, sampled_s=2).wait()
    assert time.monotonic() - started < 4
    assert "cold-JIT budget, sampled_timeout 2s" in str(caught.value)


def test_a_server_that_accepts_and_never_answers_fails_at_the_request_timeout() -> None:
    with SilentServer() as server:
        started = time.monotonic()
        with pytest.raises(ServiceNotReady) as caught:
            watcher(server.url, request_timeout_s=3, budget_s=120).wait()
    assert time.monotonic() - started < 8
    assert "GET /v1/models accepted and not answered" in str(caught.value)


# ---- HTTP errors are failures, not retries --------------------------------------------------------

def test_http_500_to_the_sampled_request_fails_at_once(refserver: RefServerProcess) -> None:
    with FaultProxy(refserver.url, sampled_500) as proxy:
        started = time.monotonic()
        with pytest.raises(ServiceNotReady) as caught:
            watcher(proxy.url).wait()
    assert time.monotonic() - started < 3
    assert "sampled request rejected" in str(caught.value) and "HTTP 500" in str(caught.value)
    assert proxy.replaced == ["POST /generate"]  # once: no retry


@pytest.mark.parametrize("status", [500, 502, 401])
def test_an_error_from_v1_models_fails_at_once(refserver: RefServerProcess, status: int) -> None:
    def rule(method: str, path: str, body: object) -> Reply | None:
        return Reply(status, b'{"detail": "nope"}') if path == "/v1/models" else None

    with FaultProxy(refserver.url, rule) as proxy:
        started = time.monotonic()
        with pytest.raises(ServiceNotReady, match=f"GET /v1/models answered HTTP {status}"):
            watcher(proxy.url).wait()
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(("status", "said"), [(200, "malformed JSON body"), (500, "answered HTTP 500")],
                         ids=["200-not-json", "500"])
def test_an_attached_server_answering_garbage_everywhere_fails_at_once(status: int, said: str) -> None:
    """Every path answers the same page (a captive portal, a misrouted proxy): readiness ends at once naming
    what it answered, never at ready_timeout."""
    with FaultProxy("http://127.0.0.1:9", lambda m, p, b: Reply(status, b"<html>portal</html>", "text/html")) as proxy:
        started = time.monotonic()
        with pytest.raises(ServiceNotReady) as caught:
            watcher(proxy.url, budget_s=60).wait()
    assert time.monotonic() - started < 5
    assert said in str(caught.value) and "<html>portal</html>" in str(caught.value), caught.value


RATE_LIMITED = b"\x1b[2Jslow down, api_key=sk-0123456789abcdefghij " + b"x" * 1000


@pytest.mark.parametrize("path", ["/v1/models", "/generate"])
def test_an_attached_server_that_keeps_answering_429_fails_after_a_grace_naming_its_answer(
        refserver: RefServerProcess, path: str) -> None:
    """429 (or 408) to every readiness request, on /v1/models or on the greedy generation: nothing here is
    starting an attached server, so after the grace (a few answers in a row) the wait ends naming the answer,
    its status and first bytes (secrets masked, control characters written out, cut), instead of spending
    the whole ready_timeout (15 min by default; 30 s here)."""
    def rule(method: str, requested: str, body: object) -> Reply | None:
        return Reply(429, RATE_LIMITED, "text/plain") if requested == path else None

    with FaultProxy(refserver.url, rule) as proxy:
        w = watcher(proxy.url, budget_s=30)
        w.attached_retry_grace_s = 2.0
        started = time.monotonic()
        with pytest.raises(ServiceNotReady) as caught:
            w.wait()
    assert time.monotonic() - started < 10
    message = str(caught.value)
    asked = "GET /v1/models" if path == "/v1/models" else GREEDY_REQUEST
    assert f"{asked} answered HTTP 429: \\x1b[2Jslow down, api_key=***REDACTED***" in message, message
    assert "answers in a row over" in message and "attached by URL" in message, message
    assert "sk-0123456789" not in message and "\x1b" not in message and len(message) < 1000, message


def test_liveness_probe_tells_refused_from_answered(refserver: RefServerProcess) -> None:
    with InferenceClient(refserver.url) as up, InferenceClient(f"http://127.0.0.1:{free_port()}") as down:
        assert HttpLiveness(up).probe() == "answered"
        assert HttpLiveness(down).probe() == "refused"
    with SilentServer() as silent, InferenceClient(silent.url) as client:
        assert HttpLiveness(client).probe() == "timeout"


# ---- later releases: the health bypass (0.5.19+), GET /ready (0.5.20+) --------------------------------

def test_with_the_health_bypass_a_cold_jit_is_not_taken_for_a_stuck_request() -> None:
    """SGLANG_DIAG_BYPASS_HEALTH_GENERATE=1 (0.5.19+): /health_generate answers 200 while the JIT blocks the
    scheduler. Not told, readiness calls the compiling request stuck; told, it gives it the cold-JIT budget."""
    env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1", BYPASS_ENV: "1"}
    why = health_bypass(env, where="this run's environment")
    args = ("--mimic-version", "0.5.19", "--speculative-algorithm", "DFLASH", "--inject", "cold-jit=4")
    with RefServerProcess(*args, env=env) as server, pytest.raises(ServiceNotReady) as caught:
        watcher(server.url, request_timeout_s=1.5, sampled_s=30).wait()
    assert "/health_generate answers 200: the scheduler is free" in str(caught.value)  # the false alarm
    with RefServerProcess(*args, env=env) as server:
        report = watcher(server.url, request_timeout_s=1.5, sampled_s=30, health_bypassed=why).wait()
    assert report.sampled_request_s is not None and report.sampled_request_s > 3


def test_a_cold_jit_past_its_budget_under_the_bypass_says_why_health_generate_was_not_asked() -> None:
    env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1", BYPASS_ENV: "yes"}
    why = health_bypass(env, where="this run's environment")
    args = ("--mimic-version", "0.5.20", "--speculative-algorithm", "DFLASH", "--inject", "cold-jit=5")
    with RefServerProcess(*args, env=env) as server, pytest.raises(ServiceNotReady) as caught:
        watcher(server.url, request_timeout_s=1, sampled_s=2, health_bypassed=why).wait()
    text = str(caught.value)
    assert "cold-JIT budget, sampled_timeout 2s); the server still answers HTTP; /health_generate was not asked " \
           f"whether the scheduler is free: {why}; GET /ready: 200 (up, healthy and not paused" in text, text


def test_readiness_stalled_on_a_paused_server_says_get_ready_503() -> None:
    env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
    with RefServerProcess("--mimic-version", "0.5.21", env=env) as server:
        httpx.post(server.url + "/pause_generation", json={"mode": "retract"}, timeout=5).raise_for_status()
        with pytest.raises(ServiceNotReady) as caught:
            watcher(server.url, budget_s=4, request_timeout_s=3).wait()
    assert str(caught.value).endswith("warmup phase: /health_generate answered 503 (warming up); GET /ready: 503 "
                                      "(not taking new requests: paused by POST /pause_generation, shutting "
                                      "down, or marked unhealthy by a failed health check)"), str(caught.value)
