"""Every wait has a deadline, and a stuck or far-too-slow service fails once, fast (issue 24, items 3 and 4).

Real pytest runs of the real suites against real refserver processes (the `wedge` and `token-delay` faults)
or tiny stdlib servers (a server that drips /server_info, a proxy whose streams send blank lines). Each run
uses a short --request-timeout and must end in about one request timeout plus a few seconds: not hang in
pytest_configure, not wait out --request-timeout once per test."""

from __future__ import annotations

import time

import pytest
from e2e_helpers import write_profile
from services.http_doubles import DripServer, FaultProxy, blank_stream
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

REQUEST_TIMEOUT_S = 3.0


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")


def test_a_server_dripping_server_info_cannot_hold_discovery(run_suite) -> None:  # type: ignore[no-untyped-def]
    # /server_info (and everything else) answered one byte every 0.5 s: no read ever times out
    with DripServer("headers", every_s=0.5, for_s=120) as server:
        started = time.monotonic()
        result = run_suite("smoke", "--attach", server.url, f"--request-timeout={REQUEST_TIMEOUT_S:g}s")
        took = time.monotonic() - started
    assert_no_crash(result)
    assert result.ret != 0
    # discovery's deadline (5 s per GET) + readiness's (--request-timeout) + pytest start-up
    assert took < 45, f"{took:.0f}s: discovery or readiness waited on a dripping server"
    result.stderr.fnmatch_lines(["[[]dflash[]] *: http://*/server_info could not be read: GET /server_info: timed out: no "
                                 "complete answer within 5s (the discovery timeout, total time): got nothing*"])
    assert verdict(run_suite.reports, host_name(server.url))["verdict"] != "pass"


def test_a_stream_of_blank_lines_fails_within_the_request_timeout(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, \
            FaultProxy(server.url, blank_stream(every_s=2.0)) as proxy:
        started = time.monotonic()
        result = run_suite("smoke", "--attach", proxy.url, "-k", "streamed", "--request-timeout=4s")
        took = time.monotonic() - started
    assert_no_crash(result)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*test_streamed_generation*", "*/generate*no complete answer within 4s "
                                 "(--request-timeout, total time)*no token at all*"])
    assert took < 40, f"{took:.0f}s: the blank lines held the stream"
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1, outcomes


@pytest.mark.heavy
@pytest.mark.parametrize(("fault", "suite", "said", "diagnosis"), [
    ("wedge=3", "smoke", "is stuck", "engine-stuck"),  # served readiness (2 requests) and one test, then never again
    # readiness's 8 tokens fit its budget; 16 tokens do not fit 3 s
    ("token-delay=0.5", "smoke", "is far too slow (0.5", "engine-far-too-slow"),
    ("wedge=3", "generation", "is stuck", "engine-stuck"),
], ids=["wedged-smoke", "slow-smoke", "wedged-generation"])
def test_a_stuck_or_slow_engine_fails_once_and_blocks_the_rest(run_suite, tmp_path, fault: str, suite: str,  # type: ignore[no-untyped-def]
                                                               said: str, diagnosis: str) -> None:
    profile = write_profile(tmp_path, "sick", {"plain": ("NONE", ["--inject", fault])})
    started = time.monotonic()
    result = run_suite(suite, "--host", str(profile), f"--request-timeout={REQUEST_TIMEOUT_S:g}s")
    took = time.monotonic() - started
    assert_no_crash(result)
    assert result.ret == 1
    data = verdict(run_suite.reports, "sick")
    failures = [f for f in data["failures"] if f.get("services") == ["plain"]]
    assert len(failures) == 1, data["failures"]  # ONE test fails, naming why…
    assert diagnosis in [d.get("id") for d in failures[0]["diagnosis"]], failures[0]  # (its message: the title)
    blocked = [b for b in data["blocked"] if b.get("services") == ["plain"]]
    assert blocked, data
    for entry in blocked:  # …the rest name it, and why
        assert failures[0]["test"] in entry["message"] and said in entry["message"], entry
        assert "--request-timeout" in entry["message"], entry
    assert data["verdict"] == "fail"
    # start-up + readiness (~8 s at 0.5 s/token) + ONE request timeout + the progress check, on a loaded machine;
    # waiting out the timeout per test takes minutes (the perf layer's own request timeout is 120 s)
    assert took < 60, f"{took:.0f}s: later tests waited out the request timeout again"
