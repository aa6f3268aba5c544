"""A report's `dflash` property carries the host's facts only when they changed since this process last sent
them; the controller's VerdictBuilder merges reports, so the verdict is the one the full state would give."""

from __future__ import annotations

import copy
import json
import types
from typing import Any

import pytest
from support.pytest_runs import verdict

from pytest_dflash.evidence.attach import _changed
from pytest_dflash.report.verdict import VerdictBuilder


def info(service_facts: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    return {"host": "ct200", "layer": "generation", "services": ["dflash"], "blocked": False, "diagnosis": [],
            "service_facts": service_facts, "notes": [], "metrics": metrics, "facts": {}}


def test_only_changes_are_sent_and_the_verdict_is_the_full_states() -> None:
    host: Any = types.SimpleNamespace(reported={})
    facts = {"dflash": {"url": "http://h:30000", "algorithm": "DFLASH", "ready": {"total_s": 2.5}}}
    metrics: dict[str, Any] = {"perf.dflash.tok_s": 900.0}
    sent = []
    for step in range(4):
        if step == 2:
            facts["dflash"]["accept_length"] = 3.2  # changed in place: seen through the JSON comparison
            metrics["perf.dflash.tok_s"] = 950.0
        sent.append(copy.deepcopy((_changed(host, "service_facts", facts), _changed(host, "metrics", metrics))))
    assert sent[0] == ({"dflash": {"url": "http://h:30000", "algorithm": "DFLASH", "ready": {"total_s": 2.5}}},
                       {"perf.dflash.tok_s": 900.0})
    assert sent[1] == ({}, {}) and sent[3] == ({}, {})
    assert sent[2][0]["dflash"]["accept_length"] == 3.2 and sent[2][1] == {"perf.dflash.tok_s": 950.0}

    deltas, full = VerdictBuilder("r"), VerdictBuilder("r")
    states = [copy.deepcopy(sent[0])] * 2 + [({"dflash": {**sent[0][0]["dflash"], "accept_length": 3.2}},
                                               {"perf.dflash.tok_s": 950.0})] * 2
    for step, ((service_facts, metric), state) in enumerate(zip(sent, states, strict=True)):
        deltas.add(f"t{step}", "call", "passed", info(service_facts, metric), "")
        full.add(f"t{step}", "call", "passed", info(*copy.deepcopy(state)), "")
    assert deltas.hosts["ct200"].services == full.hosts["ct200"].services
    assert deltas.hosts["ct200"].metrics == full.hosts["ct200"].metrics == {"perf.dflash.tok_s": 950.0}


PHASES_CONFTEST = '''
import json, os

def pytest_runtest_logreport(report):
    with open(os.environ["PHASES_LOG"], "a") as log:
        log.write(json.dumps([report.nodeid.rsplit("::", 1)[-1], report.when, report.outcome,
                              sorted({key for key, _ in report.user_properties})]) + "\\n")
'''
HOST_TESTS = '''
import pytest

@pytest.mark.host
def test_passes(dflash_host):
    pass

@pytest.mark.host
def test_fails(dflash_host):
    assert False, "the host is wrong"
'''


@pytest.mark.parametrize("junit", [False, True], ids=["plain", "junitxml"])
def test_a_passing_setup_or_teardown_that_learned_nothing_carries_no_property(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, junit: bool) -> None:
    """The call report carries the `dflash` property (the verdict counts it), a failure carries it, a passing
    setup or teardown with nothing new does not — unless --junitxml, which reads the teardown's properties — and
    the verdict is whole either way."""
    pytester.makeconftest(PHASES_CONFTEST)
    pytester.makepyfile(test_host=HOST_TESTS)
    profile = pytester.path / "box.toml"
    profile.write_text('[host]\nconnection = "local://"\n\n'  # the service is never used by these tests
                       '[services.s]\nkind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n')
    log = pytester.path / "phases.jsonl"
    monkeypatch.setenv("PHASES_LOG", str(log))
    reports = pytester.path / "reports"
    junit_args = [f"--junitxml={pytester.path / 'junit.xml'}"] if junit else []
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", str(profile),
                                           f"--dflash-report={reports}", *junit_args)
    result.assert_outcomes(passed=1, failed=1)
    phases = {(test, when): (outcome, keys) for test, when, outcome, keys in map(json.loads, log.read_text().splitlines())}
    flat = ["dflash.host", "dflash.layer", "dflash.verdict"]
    assert phases[("test_passes[box]", "call")] == ("passed", ["dflash", *flat])
    assert phases[("test_fails[box]", "call")] == ("failed", ["dflash", *flat])
    for test in ("test_passes[box]", "test_fails[box]"):
        assert phases[(test, "setup")] == ("passed", [])
        assert phases[(test, "teardown")] == ("passed", ["dflash", *flat] if junit else [])
    host = verdict(reports, "box")
    assert host["layers"]["host"] == {"passed": 1, "failed": 1, "skipped": 0, "blocked": 0, "unchecked": 0,
                                     "outcome": "failed"}
    assert [f["test"].rsplit("::", 1)[-1] for f in host["failures"]] == ["test_fails[box]"]
    if junit:
        xml = (pytester.path / "junit.xml").read_text()
        assert xml.count('name="dflash.verdict" value="passed"') == 1
        assert xml.count('name="dflash.verdict" value="failed"') == 1
