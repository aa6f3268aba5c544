"""Failures read like diagnoses (issue 32): real smoke runs attached by URL to refservers that fail, read back
from the terminal, the JUnit XML (junitparser) and the pytest-html report.

The first line of a failure is its diagnosis and remedy (issue 41), a remedy that fits attach mode; then the
exception and its message (no path, no traceback through the plugin, no repr of a fixture); with no log to read,
the diagnosis comes from what was seen over HTTP and says which evidence is missing; blocked skips point at the
test that failed, once per host."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from junitparser import Failure, JUnitXml, Properties, Skipped, TestCase
from support.pytest_runs import assert_no_crash

from pytest_dflash.refserver.launch import RefServerProcess

# what a fixture's or layer object's repr looks like: none of it belongs in a failure
REPRS = re.compile(r"ServiceHandle\(|ServiceSpec\(|LayerOptions\(|object at 0x[0-9a-f]+|threading\.Event")
MISSING = "*missing: no service log was read for *attached*--attach-log-command*log_command*"


def html_text(page: Path) -> str:
    """Everything pytest-html 4 shows: the page and its rows (a JSON blob in an attribute), unescaped."""
    text = page.read_text()
    blob = re.search(r'data-jsonblob="([^"]*)"', text)
    assert blob is not None
    return text + json.dumps(json.loads(html.unescape(blob.group(1))))


def cases(junit: Path) -> dict[str, TestCase]:
    return {case.name: case for suite in JUnitXml.fromfile(str(junit)) for case in suite}


def properties(case: TestCase) -> dict[str, str]:
    return {p.name: p.value for props in case.iterchildren(Properties) for p in props}


def outcome(case: TestCase, kind: type[Any]) -> Any:
    found = [r for r in case.result if isinstance(r, kind)]
    return found[0] if found else None


def attached_run(run_suite, tmp_path: Path, *server_args: str, extra: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    junit, page = tmp_path / "junit.xml", tmp_path / "report.html"
    with RefServerProcess("--speculative-algorithm", "DFLASH", *server_args) as server:
        result = run_suite("smoke", "--attach", server.url, f"--junitxml={junit}", f"--html={page}", "-rfs",
                           *extra)
    assert_no_crash(result)
    return result, cases(junit), html_text(page)


def test_a_death_on_the_first_sampled_request_is_diagnosed_from_http_and_blocks_once(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    result, junit, page = attached_run(run_suite, tmp_path, "--inject", "flashinfer-sm120")
    out = result.stdout.str()
    assert result.ret == 1
    # the failure starts with the diagnosis and its remedy, then the exception, then where; then the diagnosis's
    # evidence from what was seen over HTTP, then what is missing
    result.stdout.fnmatch_lines(["_*test_service_ready*_",
                                 "[[]sampling-jit-first-sampled-request] the service died on its first sampled* — "
                                 "remedy: on the server's host*",
                                 "ServiceGone: service attached is gone during readiness:*",
                                 "(raised at suites/smoke/test_smoke.py:*, in test_service_ready*)",
                                 "*dflash diagnosis*",
                                 "[[]sampling-jit-first-sampled-request] the service died on its first sampled*",
                                 "*remedy: *", "*evidence: seen over HTTP: *first sampled generation*", MISSING],
                                consecutive=True)
    # attached by URL there is no kernels layer to run: the remedy says what can be done from here
    assert "run the kernels layer" not in out
    assert "collected in" in out and "collected in 0.01s\n" not in out.replace("0.00s\n", "0.01s\n")
    # blocked skips: at the failing test's line, one folded line for the host, never at plugin.py
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED") and "blocked:" in line]
    assert len(skips) == 1, skips
    assert re.match(r"SKIPPED \[\d+\] \S*suites/smoke/test_smoke\.py:\d+: blocked: service layer failed on ", skips[0])
    assert "plugin.py" not in out and "fixtures.py" not in out
    # JUnit: message= starts with the diagnosis and its remedy; the diagnosis id in the flat property
    (failed,) = [c for c in junit.values() if outcome(c, Failure) is not None]
    message = outcome(failed, Failure).message
    assert message.startswith("[sampling-jit-first-sampled-request] the service died"), message
    assert "remedy: on the server's host" in message
    assert properties(failed)["dflash.diagnosis"] == "sampling-jit-first-sampled-request"
    blocked = [c for c in junit.values() if properties(c).get("dflash.verdict") == "blocked"]
    assert blocked and all("plugin.py" not in (outcome(c, Skipped).text or "") for c in blocked)
    # pytest-html: the Diagnosis column and the missing-evidence line
    assert "sampling-jit-first-sampled-request" in page and "--attach-log-command" in page
    assert not REPRS.search(out + page)


def test_a_test_with_nothing_to_run_against_on_a_host_is_a_skip_of_that_host_saying_why(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    """One attached server has no [parity] pair: the parity smoke test is skipped for that host, saying so, not
    pytest's 'got empty parameter set' with a [NOTSET] row that belongs to no host."""
    result, junit, page = attached_run(run_suite, tmp_path)
    out = result.stdout.str()
    assert result.ret == 0, out
    host = next(p["dflash.host"] for p in map(properties, junit.values()))
    result.stdout.fnmatch_lines([f"SKIPPED [[]1] *suites/smoke/test_smoke.py:*: does not apply to {host}: "
                                 "no [[]parity] table*"])
    case = junit[f"test_greedy_parity[{host}]"]
    assert outcome(case, Skipped).message.startswith(f"does not apply to {host}: no [parity] table")
    assert properties(case)["dflash.host"] == host and properties(case)["dflash.verdict"] == "skipped"
    xml = (tmp_path / "junit.xml").read_text()
    for text in (out, xml, page):
        assert "NOTSET" not in text and "empty parameter set" not in text


def test_zero_acceptance_fails_with_its_message_first_and_no_fixture_reprs(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    result, junit, page = attached_run(run_suite, tmp_path, "--random-draft")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["_*test_accept_length*_", "[[]draft-never-accepted]* — remedy: *",
                                 "AssertionError: *attached: no speculation in practice: accept length 1.0*",
                                 "(raised at suites/smoke/test_smoke.py:*, in test_accept_length*)",
                                 "*dflash diagnosis*", "[[]draft-never-accepted]*", "*remedy: *",
                                 "*evidence: seen over HTTP: *no speculation in practice*", MISSING],
                                consecutive=True)
    (failed,) = [c for c in junit.values() if outcome(c, Failure) is not None]
    message = outcome(failed, Failure).message
    assert message.startswith("[draft-never-accepted] ") and " — remedy: " in message, message
    assert properties(failed)["dflash.diagnosis"] == "draft-never-accepted"
    xml = (tmp_path / "junit.xml").read_text()
    assert not REPRS.search(result.stdout.str() + page + xml), REPRS.search(result.stdout.str() + page + xml)


@pytest.mark.parametrize("fault", ["wedge=3"])
def test_a_wedged_engine_attached_by_url_says_which_evidence_is_missing(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path, fault: str) -> None:
    result, junit, page = attached_run(run_suite, tmp_path, "--inject", fault, extra=("--request-timeout=5s",))
    assert result.ret == 1
    result.stdout.fnmatch_lines(["[[]engine-stuck]* — remedy: on the server's host*", "DeadlineExceeded: *attached*",
                                 "(raised at suites/smoke/test_smoke.py:*",
                                 "*dflash diagnosis*", "[[]engine-stuck]*", "*remedy: *", "*evidence: *", MISSING],
                                consecutive=True)
    (failed,) = [c for c in junit.values() if outcome(c, Failure) is not None]
    assert outcome(failed, Failure).message.startswith("[engine-stuck] ")
    assert properties(failed)["dflash.diagnosis"] == "engine-stuck"
    assert not REPRS.search(result.stdout.str() + page)


def test_a_users_own_assert_keeps_its_explanation_and_shows_fixtures_short(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A suite's own `assert` keeps pytest's traceback and explanation; the plugin's fixtures in it (arguments,
    --showlocals) read `<ServiceHandle host/service>`, in the terminal, JUnit and the HTML report."""
    pytester.makepyfile(test_own="""
        import pytest

        @pytest.mark.generation
        def test_mine(dflash_service, dflash_layer_options):
            handle = dflash_service
            assert handle.name == "nope"
        """)
    junit, page = tmp_path / "junit.xml", tmp_path / "report.html"
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
        result = pytester.runpytest_subprocess("--attach", server.url, "-p", "no:cacheprovider", "--showlocals",
                                               f"--dflash-report={tmp_path / 'reports'}", f"--junitxml={junit}",
                                               f"--html={page}")
    assert_no_crash(result)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["dflash_service = <ServiceHandle *:*/attached>", "dflash_layer_options = <LayerOptions>",
                                 '>*assert handle.name == "nope"', "E*AssertionError: assert 'attached' == 'nope'*",
                                 "dflash_service = <ServiceHandle *:*/attached>",
                                 "handle * = <ServiceHandle *:*/attached>"])
    everything = result.stdout.str() + junit.read_text() + html_text(page)
    assert not REPRS.search(everything), REPRS.search(everything)
