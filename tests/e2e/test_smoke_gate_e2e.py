"""suites/smoke can gate a deploy: each fault a deploy must refuse fails smoke, naming the problem; attach is read-only.

Real pytest runs (pytester) of the real smoke suite against real refserver processes with the fault injected, and
the healthy case next to each.
"""

from __future__ import annotations

import re
from pathlib import Path

from e2e_helpers import write_profile
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

# The access lines of a refserver (uvicorn's format): `INFO:     127.0.0.1:PORT - "POST /generate HTTP/1.1" 200 OK`.
ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>/[^ ?"]*)\S* HTTP/1\.1"')
# What reads a server without changing its state: generations and GETs.
GENERATION_PATHS = {"/generate", "/v1/completions", "/v1/chat/completions"}


def requests_seen(log: str) -> list[tuple[str, str]]:
    return [(m["method"], m["path"]) for m in ACCESS.finditer(log)]


def test_healthy_services_pass_every_new_smoke_check(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    floors = "\n[floors.dflash]\naccept_length = 2.0\n"  # the refserver's DFLASH reaches ~3.6 on the smoke prompts
    profile = write_profile(tmp_path, "healthy", {"none": ("NONE", []), "dflash": ("DFLASH", [])},
                            parity=("none", ["dflash"]), extra=floors)
    result = run_suite("smoke", "--host", str(profile), "-m", "service or generation or parity or perf", "-rA")
    assert_no_crash(result)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 16, outcomes
    result.stdout.fnmatch_lines(["PASSED *test_serves_the_profiles_algorithm[[]healthy/dflash[]]*",
                                 "PASSED *test_sampling_varies_with_seed[[]healthy/dflash[]]*",
                                 "PASSED *test_greedy_parity[[]healthy/none~dflash[]]*",
                                 "PASSED *test_accept_length[[]healthy/dflash[]]*",
                                 "PASSED *test_per_token_latency[[]healthy/dflash[]]*"], consecutive=False)
    metrics = verdict(run_suite.reports, "healthy")["metrics"]
    assert metrics["token_latency:dflash"]["source"] == "the default sanity ceiling"  # no latency floor set
    assert metrics["parity-slice:none~dflash"]["max_tie_rate"] == 0.25


def test_a_verifier_that_ignores_temperature_fails_smoke_naming_it(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "fallback", {"dflash": ("DFLASH", ["--inject", "greedy-fallback"])})
    result = run_suite("smoke", "--host", str(profile), "-m", "generation")
    assert_no_crash(result)
    result.assert_outcomes(passed=4, failed=1, skipped=1)  # greedy, sampled, streamed and constrained
    # requests look fine; no --tool-call-parser: no forced call
    result.stdout.fnmatch_lines([
        "*AssertionError: greedy fallback: * pairs of samples (temperature 1, seeds 500..531, /generate) share their "
        "first token and every such pair is identical after it*",
        "*The server log says: *falling back to greedy argmax verification*",
    ], consecutive=False)
    assert verdict(run_suite.reports, "fallback")["layers"]["generation"]["outcome"] == "failed"


def test_a_dflash_unit_that_serves_plain_decoding_fails_smoke_naming_the_algorithm(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # the profile says DFLASH; the server is started with --speculative-algorithm NONE (the last flag wins)
    profile = write_profile(tmp_path, "plain", {"dflash": ("DFLASH", ["--speculative-algorithm", "NONE"])})
    result = run_suite("smoke", "--host", str(profile), "-m", "service or perf")
    assert_no_crash(result)
    result.stdout.fnmatch_lines(["*_ test_serves_the_profiles_algorithm[[]plain/dflash[]] _*",
                                 "*plain/dflash: the profile says DFLASH, the server runs NONE*"])
    data = verdict(run_suite.reports, "plain")
    assert data["verdict"] == "fail" and data["layers"]["service"]["outcome"] == "failed"


def test_an_accept_length_under_the_profiles_floor_fails_smoke_with_the_number(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    floors = "\n[floors.dflash]\naccept_length = 8.5\n"  # 8 draft tokens: the refserver reaches ~3.6 here
    profile = write_profile(tmp_path, "lowaccept", {"dflash": ("DFLASH", [])}, extra=floors)
    result = run_suite("smoke", "--host", str(profile), "-k", "accept_length")
    assert_no_crash(result)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*lowaccept/dflash: drafts accepted less often than required: accept length *.* on 3 "
                                 "greedy prompts (meta_info; *) < 8.5 required by [[]floors.dflash[]] accept_length of "
                                 "*lowaccept.toml*"])
    match = re.search(r"accept length (\d+\.\d+) on 3 greedy prompts \(meta_info; [^)]*\) < 8\.5", result.stdout.str())
    assert match and 2.0 < float(match[1]) < 6.0, match


def test_a_server_streaming_a_few_tokens_a_second_fails_the_latency_ceiling(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # 8 ms per step x 40 = 320 ms per token (about 3 tokens/s) on a plain server: over the 250 ms default ceiling
    profile = write_profile(tmp_path, "slow", {"none": ("NONE", ["--gpu-step-ms", "8", "--inject", "slow-decode=40"])})
    result = run_suite("smoke", "--host", str(profile), "-k", "per_token_latency")
    assert_no_crash(result)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*slow/none: TPOT (time per output token) FAIL — * ms (* tokens/s) > ceiling 250 ms "
                                 "(the default sanity ceiling) on one streamed greedy request of 32 tokens*"])
    data = verdict(run_suite.reports, "slow")
    assert data["layers"]["perf"]["outcome"] == "failed" and data["metrics"]["token_latency:none"]["tpot_ms"] > 250


def test_smoke_parity_applies_the_tie_gap_and_max_tie_rate_options(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A lossy tree verifier accepts the target's runner-up: with a huge --parity-tie-gap every such divergence
    counts as a tie, so only max_tie_rate can fail it — and --parity-max-tie-rate 1 lets it through."""
    profile = write_profile(tmp_path, "ties", {"none": ("NONE", []), "ddtree": ("DDTREE", ["--inject", "tree-verify-bug"])},
                            parity=("none", ["ddtree"]))
    strict = run_suite("smoke", "--host", str(profile), "-m", "parity", "--parity-tie-gap", "100")
    assert_no_crash(strict)
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*prompts diverged at numerical ties or noise: tie rate * > max_tie_rate 0.25*"])
    lenient = run_suite("smoke", "--host", str(profile), "-m", "parity", "--parity-tie-gap", "100",
                        "--parity-max-tie-rate", "1")
    lenient.assert_outcomes(passed=1)


def test_attach_sends_no_flush_cache_unless_allowed(run_suite) -> None:  # type: ignore[no-untyped-def]
    """smoke and the perf layer against an attached DFLASH server: its access log shows only generations and
    GETs; with --allow-state-changes the perf run flushes before reading the server-side accept length."""
    perf = ("--perf-requests", "4", "--perf-concurrency", "1", "--perf-warmup", "0")
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
        before = len(server.log_text())
        result = run_suite(["smoke", "perf"], "--attach", server.url, *perf, "-rA")
        assert_no_crash(result)
        seen = requests_seen(server.log_text()[before:])
        assert ("POST", "/generate") in seen, seen[-20:]  # the run did talk to the server
        changing = sorted({f"{m} {p}" for m, p in seen if m != "GET" and p not in GENERATION_PATHS})
        assert changing == [], f"attach mode sent state-changing requests: {changing}"
        result.stdout.fnmatch_lines(["*no server-side value (not read: it is only meaningful after a /flush_cache*"
                                     "--allow-state-changes*"])

        before = len(server.log_text())
        allowed = run_suite("perf", "--attach", server.url, "-k", "accept_length", *perf, "--allow-state-changes", "-rA")
        assert_no_crash(allowed)
        assert ("POST", "/flush_cache") in requests_seen(server.log_text()[before:])
        # the measured line carries the server-side value once it was read after the flush (also when a loaded CI
        # machine saturates the load client and the judgement is refused)
        allowed.stdout.fnmatch_lines(["*(DFLASH): * output tok/s, *accept length * (client; server-reported [0-9]*)*"])


def test_the_deploy_gate_sees_a_forced_tool_call_that_is_never_made(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 39: smoke passed a server that ignores tools and tool_choice (whole smoke, `--gate
    service,generation`: PASSED, exit 0; only suites/generation failed it). Now smoke's one forced call fails
    that service's generation layer and the gate; the healthy service beside it passes."""
    tools = ["--tool-call-parser", "qwen25", "--constrained-json-disable-any-whitespace"]
    profile = write_profile(tmp_path, "gatetools", {"notools": ("DFLASH", [*tools, "--inject", "ignore-tools"]),
                                                    "tools": ("NONE", tools)})
    result = run_suite("smoke", "--host", str(profile), "--gate", "service,generation", "-rA")
    assert_no_crash(result)
    data = verdict(run_suite.reports, "gatetools")
    assert [f["test"].rsplit("::", 1)[1] for f in data["failures"]] == ["test_forced_tool_call[gatetools/notools]"]
    result.stdout.fnmatch_lines(["PASSED *test_forced_tool_call[[]gatetools/tools[]]*"], consecutive=False)
    result.stdout.fnmatch_lines(["*notools: tool_choice \"required\" (--tool-call-parser qwen)*no tool call at all*"
                                 "the forced call was never made*"])
    result.stdout.fnmatch_lines(["gate service,generation: FAILED*"])
    assert result.ret != 0 and data["layers"]["generation"]["outcome"] == "failed"
