"""A gateway can hide SGLang (issue 39): in front of a DFLASH server it answers 404 to /server_info and
/generate, so the server looks like "not an SGLang server" and every accept-length check "does not apply".
`--attach-algorithm` declares what an attached URL serves: declared speculative behind such a gateway, the
accept-length and algorithm checks could not be made (host partial, gate refused, the gateway named); with
nothing declared the verdict says the algorithm is unknown, never NONE. Real refserver processes behind a
small stdlib proxy."""

from __future__ import annotations

from typing import Any

from services.http_doubles import FaultProxy, Reply
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

GATE = ("--gate", "service,generation,perf")
DFLASH = ("--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8")
HIDDEN = {"/server_info", "/get_server_info", "/model_info", "/get_model_info", "/generate"}


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")


def hides_sglang(method: str, path: str, body: Any) -> Reply | None:
    """A gateway that routes only the OpenAI API: SGLang's native routes are 404, as FastAPI answers."""
    return Reply(404, b'{"detail":"Not Found"}') if path.split("?")[0] in HIDDEN else None


def unchecked(data: dict[str, Any]) -> dict[str, str]:
    return {s["test"].split("::")[-1].split("[")[0]: s["message"] for s in data["skipped"]
            if s["kind"] == "could not check"}


def test_a_declared_dflash_server_behind_a_gateway_is_could_not_check_and_refuses_the_gate(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess(*DFLASH) as server, FaultProxy(server.url, hides_sglang) as gateway:
        hidden = run_suite("smoke", "--attach", gateway.url, "--attach-algorithm", "dflash", *GATE)
        direct = run_suite("smoke", "--attach", server.url, "--attach-algorithm", "DFLASH", *GATE)
        healthy = verdict(run_suite.reports, host_name(server.url))
        wrong = run_suite("smoke", "--attach", server.url, "--attach-algorithm", "DDTREE", "-m", "service")
    assert_no_crash(hidden)
    assert hidden.ret == 1, hidden.stdout.str()[-3000:]
    assert "not an SGLang server" not in hidden.stdout.str()
    hidden.stdout.fnmatch_lines(["* PARTIAL *", "  gate refused: * check(s) of the service layer could not be made*"
                                 "declared DFLASH (--attach-algorithm) and answers no /server_info*attach to the "
                                 "SGLang server itself, not a gateway in front of it*"])
    data = verdict(run_suite.reports, host_name(gateway.url))
    assert data["verdict"] == "partial", data["verdict"]
    assert data["services"]["attached"]["algorithm"] == "DFLASH"
    missed = unchecked(data)
    assert {"test_serves_the_profiles_algorithm", "test_accept_length"} <= set(missed), data["skipped"]
    assert "accept length" in missed["test_accept_length"] and "gateway" in missed["test_accept_length"]
    # the healthy case: declared and served alike, attached to SGLang itself
    assert_no_crash(direct)
    assert direct.ret == 0, direct.stdout.str()[-3000:]
    assert healthy["verdict"] == "pass" and not unchecked(healthy), healthy["skipped"]
    # a declaration is compared with what /server_info says
    wrong.stdout.fnmatch_lines(["*the profile says DDTREE, the server runs DFLASH*"])
    assert wrong.ret == 1


def test_an_undeclared_server_behind_a_gateway_has_an_unknown_algorithm_never_none(run_suite) -> None:  # type: ignore[no-untyped-def]
    """Before: `attached: NONE` in the verdict, PASS, the accept-length check unselected in silence."""
    with RefServerProcess(*DFLASH) as server, FaultProxy(server.url, hides_sglang) as gateway:
        result = run_suite("smoke", "--attach", gateway.url, "-rs")
    assert_no_crash(result)
    result.stdout.fnmatch_lines(["    attached: algorithm unknown*--attach-algorithm*"])
    result.stdout.fnmatch_lines(["SKIPPED * its speculative algorithm is unknown: it answers no /server_info (not "
                                 "SGLang, or a gateway in front of it)*--attach-algorithm*"])
    facts = verdict(run_suite.reports, host_name(gateway.url))["services"]["attached"]
    assert facts["algorithm"] == "unknown", facts
    assert "--attach-algorithm" in facts["algorithm_unknown"]


def test_attach_algorithm_needs_attach_and_one_of_the_algorithms(run_suite) -> None:  # type: ignore[no-untyped-def]
    bad = run_suite("smoke", "--attach", "http://127.0.0.1:9", "--attach-algorithm", "DFLSAH")
    assert bad.ret == 4
    bad.stderr.fnmatch_lines(["ERROR: --attach-algorithm / dflash_attach_algorithm: 'DFLSAH' is not one of NONE, "
                              "DFLASH, *"])
    alone = run_suite("smoke", "--host", "local", "--attach-algorithm", "DFLASH", "--collect-only")
    assert alone.ret == 4
    alone.stderr.fnmatch_lines(["ERROR: --attach-algorithm / dflash_attach_algorithm: needs --attach URL"])
