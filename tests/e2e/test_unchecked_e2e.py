"""A check that could not run is not a pass (issue 31): a DFLASH server whose drafts are never accepted
(refserver --random-draft) fails smoke attached directly; behind a proxy that answers /server_info 503 twice
right after readiness it still fails (the metadata routes ride out a transient answer); behind a gateway that
never routes /server_info while /generate still answers, its profile's DFLASH checks could not be made: the host
is partial at best, and a gate over the service layer fails naming why. Never PASS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from services.http_doubles import FaultProxy, FlakyRoute
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

GATE = ("--gate", "service,generation,perf")
NEVER_ACCEPTED = "*no speculation in practice: accept length 1.0*"


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")  # ":" is not kept in file names


@pytest.mark.heavy
def test_never_accepted_drafts_fail_attached_directly_and_behind_a_flaky_server_info(run_suite) -> None:  # type: ignore[no-untyped-def]
    rule = FlakyRoute(status=503, times=2, after_generations=2)  # greedy + sampled: the readiness generations
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--random-draft") as server:
        direct = run_suite("smoke", "--attach", server.url, *GATE)
        with FaultProxy(server.url, rule) as proxy:
            flaky = run_suite("smoke", "--attach", proxy.url, *GATE)
    for result, url in ((direct, server.url), (flaky, proxy.url)):
        assert_no_crash(result)
        assert result.ret == 1, result.stdout.str()[-3000:]
        result.stdout.fnmatch_lines([NEVER_ACCEPTED, "gate service,generation,perf: FAILED*"])
        data = verdict(run_suite.reports, host_name(url))
        assert data["verdict"] == "fail", data["verdict"]
        assert data["services"]["attached"]["algorithm"] == "DFLASH"
        failures = {f["test"].split("::")[-1].split("[")[0]: f for f in data["failures"]}
        assert "no speculation in practice" in json.dumps(failures["test_accept_length"])
        assert not [s for s in data["skipped"] if s["kind"] == "could not check"], data["skipped"]
    assert rule.replaced == 2  # the proxy really answered 503 twice after readiness


def test_a_gateway_without_server_info_leaves_a_dflash_profile_partial_and_fails_its_gate(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    rule = FlakyRoute(status=404, times=None)  # /server_info never routed; /generate still has meta_info
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--random-draft") as server, \
            FaultProxy(server.url, rule) as gateway:
        profile = tmp_path / "gw.toml"
        profile.write_text(f'[host]\nconnection = "local://"\n[services.dflash]\nkind = "external"\n'
                           f'url = "{gateway.url}"\nalgorithm = "DFLASH"\n')
        gated = run_suite("smoke", "--host", str(profile), *GATE)
        ungated = run_suite("smoke", "--host", str(profile))
    for result in (gated, ungated):
        assert_no_crash(result)
        assert "gw: PASS" not in result.stdout.str()
    assert gated.ret == 1, gated.stdout.str()[-3000:]
    gated.stdout.fnmatch_lines(["gw: PARTIAL *",
                                "  gate refused: gw: * check(s) of the service layer could not be made (first: "
                                "*test_serves_the_profiles_algorithm[[]gw/dflash[]]*: gw/dflash: needs SGLang's "
                                "/server_info, but it is declared DFLASH (the profile *gw.toml) and answers no "
                                "/server_info: attach to the SGLang server itself, not a gateway in front of it)"])
    data = verdict(run_suite.reports, "gw")
    assert data["verdict"] == "partial", data["verdict"]
    assert any("of the service layer could not be made" in why for why in data["partial"]), data["partial"]
    unchecked = {s["test"].split("::")[-1].split("[")[0] for s in data["skipped"] if s["kind"] == "could not check"}
    assert {"test_serves_the_profiles_algorithm", "test_serves_the_profiles_speculation",
            "test_accept_length"} <= unchecked, unchecked
    assert data["layers"]["service"]["unchecked"] >= 2
    assert any("only /v1/models was compared" in note for note in data["notes"]), data["notes"]


@pytest.mark.heavy
@pytest.mark.parametrize("status", [503, 501])
def test_a_server_info_that_keeps_failing_after_readiness_is_could_not_check_never_not_sglang(  # type: ignore[no-untyped-def]
        run_suite, status: int) -> None:
    """Read at discovery, then 503 (or a proxy's 501, which SGLang never answers) for good: the checks that need
    /server_info could not be made, naming the status; never "not an SGLang server"."""
    rule = FlakyRoute(status=status, times=None, after_generations=2)
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--random-draft") as server, \
            FaultProxy(server.url, rule) as proxy:
        result = run_suite("smoke", "--attach", proxy.url, *GATE)
    assert_no_crash(result)
    assert result.ret == 1, result.stdout.str()[-3000:]
    text = result.stdout.str()
    assert "not an SGLang server" not in text
    result.stdout.fnmatch_lines(["  gate refused: * check(s) of the service layer could not be made (first: *"
                                 f"but /server_info could not be read: GET /server_info: HTTP {status}: *"])
    data = verdict(run_suite.reports, host_name(proxy.url))
    assert data["verdict"] in ("partial", "fail") and data["verdict"] != "pass"
    assert f"HTTP {status}" in data["services"]["attached"]["server_info_error"]
    unchecked = {s["test"].split("::")[-1].split("[")[0] for s in data["skipped"] if s["kind"] == "could not check"}
    assert {"test_serves_the_profiles_speculation", "test_accept_length"} <= unchecked, unchecked


def test_a_proxy_answering_501_for_server_info_never_makes_a_dflash_server_plain(run_suite) -> None:  # type: ignore[no-untyped-def]
    """A proxy that answers 501 (Not Implemented) for /server_info in front of an attached DFLASH server: SGLang
    never answers 501 (404 for an unknown path), so this is no proof that the server is not SGLang. Its algorithm
    stays unknown (discovery names HTTP 501) and the service layer fails: never a PASS with every speculative
    check unselected, as "not SGLang: plain" gave."""
    rule = FlakyRoute(status=501, times=None)
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, FaultProxy(server.url, rule) as proxy:
        result = run_suite("smoke", "--attach", proxy.url, *GATE)
    assert_no_crash(result)
    assert result.ret == 1, result.stdout.str()[-3000:]
    assert "not an SGLang server" not in result.stdout.str()
    result.stderr.fnmatch_lines(["*/server_info could not be read: GET /server_info answered HTTP 501*"])
    data = verdict(run_suite.reports, host_name(proxy.url))
    assert data["verdict"] == "fail", data["verdict"]
    failures = {f["test"].split("::")[-1].split("[")[0]: f for f in data["failures"]}
    assert "HTTP 501" in json.dumps(failures["test_serves_the_profiles_algorithm"]), failures
    assert rule.replaced >= 2
