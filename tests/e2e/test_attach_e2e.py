"""Attach mode fails fast: `pytest --attach URL suites/smoke` (and kind = "external" services) against
real refserver processes that die, hang, answer 500 or answer megabytes. With no process to ask, death
and silence are read over HTTP; each must end in a failing verdict in seconds, not in the budgets."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest
from services.http_doubles import FaultProxy, huge_generation, sampled_500
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

# the client sees the drop and then the probe the refusal; under load the probe can see the refusal first
GONE = re.compile(r"ServiceGone: service attached is gone during readiness: first sampled generation \(temperature "
                  r"0\.8, top_k 20, top_p 0\.9\): POST /generate \(max_new_tokens 8, temperature 0\.8, top_p 0\.9, "
                  r"top_k 20\) killed it: (no HTTP response \(connection dropped\), then connections refused|"
                  r"connections refused while it was in flight).*\(seen over HTTP: attached by URL, no process to ask\)")


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")  # ":" is not kept in file names


def record_exit(server: RefServerProcess) -> dict[str, float]:
    seen: dict[str, float] = {}

    def wait() -> None:
        server.wait_exit(300)
        seen["died"] = time.monotonic()

    threading.Thread(target=wait, name="exit-clock", daemon=True).start()
    return seen


def test_a_server_killed_by_its_first_sampled_request_fails_the_run_within_seconds(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "flashinfer-sm120") as server:
        seen = record_exit(server)
        result = run_suite("smoke", "--attach", server.url)
        ended = time.monotonic()
    assert_no_crash(result)
    assert result.ret == 1
    assert ended - seen["died"] < 5.0, f"verdict {ended - seen['died']:.1f}s after the death"
    assert GONE.search(result.stdout.str()), result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed", 0) == 0, outcomes
    assert "connection refused" not in result.stdout.str().lower().replace("connections refused", "")
    data = verdict(run_suite.reports, host_name(server.url))
    assert data["verdict"] == "fail" and data["layers"]["service"]["outcome"] == "failed"
    assert data["layers"]["generation"]["outcome"] == "blocked"


def test_an_attached_server_that_died_is_drawn_in_the_cold_start_up_to_where_it_stopped(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    """Its port opened and its greedy request was answered, then its first sampled request took it down: the
    verdict records that much (`stopped`), and the HTML report's timeline draws it, in red, with where it
    stopped."""
    page = tmp_path / "report.html"
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "flashinfer-sm120") as server:
        result = run_suite("smoke", "--attach", server.url, f"--html={page}")
    assert_no_crash(result)
    assert result.ret == 1
    facts = verdict(run_suite.reports, host_name(server.url))["services"]["attached"]
    assert "ready" not in facts
    stopped = facts["stopped"]
    assert stopped["http_s"] is not None and stopped["greedy_s"] is not None and stopped["sampled_s"] is None
    assert set(stopped["phases"]) == {"port_open", "first_greedy"}, stopped["phases"]
    assert stopped["total_s"] >= stopped["greedy_s"]
    html = page.read_text()
    block = html.split('class="dflash-cold-start" data-host=', 1)[1].split("</table>", 1)[0]
    assert "never ready (stopped in its first sampled request, after " in block
    assert re.findall(r'data-phase="([a-z_]+)"><title>attached:', block) == ["port_open", "first_greedy",
                                                                          "stopped"]
    assert "[sampling-jit-first-sampled-request] the service died on its first sampled request" in block
    assert 'class="dflash-never-ready"' in block  # its row in the phase table, too


def test_a_greedy_request_never_answered_fails_the_run_at_the_request_timeout(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "hang=1") as server:
        started = time.monotonic()
        result = run_suite("smoke", "--attach", server.url, "--request-timeout=5s")
        took = time.monotonic() - started
        assert server.returncode is None, "attach mode must not stop the server"
    assert_no_crash(result)
    assert result.ret == 1 and took < 20, took
    result.stdout.fnmatch_lines(["*ServiceNotReady: service attached not ready after 5s: greedy phase: POST /generate "
                                 "(max_new_tokens 8, temperature 0.0) accepted and not answered for 5.[0-9]*s "
                                 "(--request-timeout 5s); the server still answers HTTP*"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed", 0) == 0, outcomes
    assert verdict(run_suite.reports, host_name(server.url))["layers"]["generation"]["outcome"] == "blocked"


def test_http_500_to_sampled_requests_fails_the_run_at_once(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, \
            FaultProxy(server.url, sampled_500) as proxy:
        started = time.monotonic()
        result = run_suite("smoke", "--attach", proxy.url)
        took = time.monotonic() - started
    assert_no_crash(result)
    assert result.ret == 1 and took < 20, took
    result.stdout.fnmatch_lines(["*ServiceNotReady: service attached not ready after *: sampled request rejected: "
                                 "*/generate: HTTP 500: Internal server error*"])
    assert proxy.replaced == ["POST /generate"], "a 5xx to a readiness request is not retried"


def test_megabytes_for_a_few_tokens_fail_with_their_size_and_stay_out_of_the_reports(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    junit = tmp_path / "junit.xml"
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, \
            FaultProxy(server.url, huge_generation(16 * 1024 * 1024, chunked=True)) as proxy:
        result = run_suite("smoke", "--attach", proxy.url, f"--junitxml={junit}")
    assert_no_crash(result)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*greedy request rejected: *HTTP 200: response body too large: *+ bytes read, "
                                 "over the *-byte cap for this request (the rest was not read)*"])
    assert junit.stat().st_size < 200_000
    assert sum(p.stat().st_size for p in run_suite.reports.rglob("*") if p.is_file()) < 2_000_000


def test_a_server_that_dies_after_readiness_is_seen_gone_and_blocks_the_rest(run_suite) -> None:  # type: ignore[no-untyped-def]
    # readiness makes 2 generations; the 3rd completed one is answered, then the server SIGKILLs itself
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "oom-kill=3") as server:
        result = run_suite("smoke", "--attach", server.url)
    assert_no_crash(result)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*service 127.0.0.1:*/attached is gone: connections refused after it had passed "
                                 "readiness (seen over HTTP*"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 1 and outcomes.get("failed", 0) >= 1, outcomes
    assert "BLOCKED" in result.stdout.str()


def test_an_external_service_gets_the_cold_jit_budget_only_up_to_its_sampled_timeout(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "cold-jit=4", env=env) as server:
        profile = tmp_path / "ext.toml"
        profile.write_text(f'[host]\nconnection = "local://"\n[services.remote]\nkind = "external"\n'
                           f'url = "{server.url}"\nalgorithm = "DFLASH"\nsampled_timeout = "2s"\n')
        started = time.monotonic()
        result = run_suite("smoke", "--host", str(profile), "-m", "service", "--request-timeout=1s")
        took = time.monotonic() - started
    assert_no_crash(result)
    assert result.ret == 1 and took < 30, took
    result.stdout.fnmatch_lines(["*sampled phase: POST /generate (*top_k 20) accepted and not answered for 2.[0-9]*s "
                                 "(the first sampled request's cold-JIT budget, sampled_timeout 2s); the server "
                                 "still answers HTTP*"])


# The first sampled request blocks 6 s, past the 4 s request timeout: only the cold-JIT rule lets it pass. The
# smoke suite's other requests get 4 s each (2 s was too little for a batch of seeded samples on a loaded CI box).
@pytest.mark.parametrize("cold_jit", [6], ids=["cold-jit-6s"])
def test_healthy_attach_waits_through_refused_warm_up_and_a_cold_jit(run_suite, cold_jit: int) -> None:  # type: ignore[no-untyped-def]
    """The healthy side of every rule above: nothing listening yet, /health_generate 503 while warming up, and
    a first sampled request that takes longer than --request-timeout while the server answers HTTP: a pass."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    started: list[RefServerProcess] = []

    def start_later() -> None:
        time.sleep(2.0)  # the run starts against a port nobody listens on yet
        server = RefServerProcess("--speculative-algorithm", "DFLASH", "--port", str(port), "--inject",
                                  f"cold-jit={cold_jit}", wait_ready=False,
                                  env={**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
        server.start()
        started.append(server)

    starter = threading.Thread(target=start_later, daemon=True)
    starter.start()
    try:
        result = run_suite("smoke", "--attach", f"http://127.0.0.1:{port}", "--request-timeout=4s")
    finally:
        starter.join(timeout=30)
        for server in started:
            server.stop()
    assert_no_crash(result)
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 5, (
        outcomes, result.stdout.str()[-3000:])
    ready = verdict(run_suite.reports, host_name(f"http://127.0.0.1:{port}"))["services"]["attached"]["ready"]
    assert ready["sampled_request_s"] > 4, ready  # the cold-JIT rule was what let it pass
