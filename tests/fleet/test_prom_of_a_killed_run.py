"""A run killed outright (SIGKILL: an OOM kill, a CI timeout's kill -9) never reaches its end: the Prometheus
textfiles (the report dir's fleet.prom and --prometheus FILE, a node_exporter textfile) must not keep the last
run's `dflash_host_pass 1` (a review of issues 39-41: the verdict file said 'interrupted', fleet.prom still
said pass), nor fleet-summary.json/.html and fleet-junit.xml the last run's pass (issue 39: they stayed as
they were)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.pytest_runs import EXTERNAL_DFLASH_PROFILE

SUITE = """
import os, signal
import pytest

@pytest.mark.host
def test_reachable(dflash_host):
    if os.environ.get("KILL_ME"):
        os.kill(os.getpid(), signal.SIGKILL)
"""


def _pass_gauge(path: Path) -> str:
    found = re.findall(r'^dflash_host_pass\{host="gpu-a"\} (\S+)$', path.read_text(), re.M)
    assert len(found) == 1, path.read_text()
    return found[0]


def test_a_killed_run_leaves_no_pass_in_the_prometheus_textfiles(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_STATE_DIR", str(pytester.path / "state"))
    for name in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS", "KILL_ME"):
        monkeypatch.delenv(name, raising=False)
    (pytester.path / "suites" / "mini").mkdir(parents=True)
    (pytester.path / "suites" / "mini" / "test_mini.py").write_text(SUITE)
    (pytester.path / "gpu-a.toml").write_text(EXTERNAL_DFLASH_PROFILE)
    reports, textfile = pytester.path / "reports", pytester.path / "node.prom"
    args = ("-p", "no:cacheprovider", "--host", str(pytester.path / "gpu-a.toml"), f"--dflash-report={reports}",
            f"--prometheus={textfile}", "suites/mini")
    assert pytester.runpytest_subprocess(*args).ret == 0
    assert _pass_gauge(reports / "fleet.prom") == _pass_gauge(textfile) == "1.0"
    monkeypatch.setenv("KILL_ME", "1")
    assert pytester.runpytest_subprocess(*args).ret not in (0, 1)  # killed
    assert _pass_gauge(reports / "fleet.prom") == _pass_gauge(textfile) == "0.0"


def test_a_killed_run_leaves_no_pass_in_the_fleet_summary_and_junit(pytester: pytest.Pytester,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_STATE_DIR", str(pytester.path / "state"))
    for name in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS", "KILL_ME"):
        monkeypatch.delenv(name, raising=False)
    (pytester.path / "suites" / "mini").mkdir(parents=True)
    (pytester.path / "suites" / "mini" / "test_mini.py").write_text(SUITE)
    (pytester.path / "gpu-a.toml").write_text(EXTERNAL_DFLASH_PROFILE)
    reports = pytester.path / "reports"
    args = ("-p", "no:cacheprovider", "--host", str(pytester.path / "gpu-a.toml"), f"--dflash-report={reports}",
            "suites/mini")
    assert pytester.runpytest_subprocess(*args).ret == 0
    summary = json.loads((reports / "fleet-summary.json").read_text())
    assert summary["hosts"]["gpu-a"]["verdict"] == "pass"
    assert "<error" not in (reports / "fleet-junit.xml").read_text()
    monkeypatch.setenv("KILL_ME", "1")
    assert pytester.runpytest_subprocess(*args).ret not in (0, 1)  # killed
    summary = json.loads((reports / "fleet-summary.json").read_text())
    assert summary["hosts"]["gpu-a"]["verdict"] == "interrupted", summary["hosts"]["gpu-a"]
    junit = (reports / "fleet-junit.xml").read_text()
    assert '<error type="interrupted"' in junit and 'classname="dflash.gpu-a" name="run"' in junit, junit
    assert "interrupted" in (reports / "fleet-summary.html").read_text()
    # the next whole run: its trend compares with the last summary written (the killed run's), and says pass
    monkeypatch.delenv("KILL_ME")
    assert pytester.runpytest_subprocess(*args).ret == 0
    summary = json.loads((reports / "fleet-summary.json").read_text())
    assert summary["hosts"]["gpu-a"]["verdict"] == "pass" and "<error" not in (reports / "fleet-junit.xml").read_text()


def test_a_whole_run_keeps_the_trend_against_the_summary_it_found(pytester: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary file says 'interrupted' while the run goes on; its trend is still against the one before."""
    monkeypatch.setenv("DFLASH_STATE_DIR", str(pytester.path / "state"))
    for name in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS", "KILL_ME"):
        monkeypatch.delenv(name, raising=False)
    (pytester.path / "suites" / "mini").mkdir(parents=True)
    (pytester.path / "suites" / "mini" / "test_mini.py").write_text(SUITE)
    (pytester.path / "gpu-a.toml").write_text(EXTERNAL_DFLASH_PROFILE)
    reports = pytester.path / "reports"
    args = ("-p", "no:cacheprovider", "--host", str(pytester.path / "gpu-a.toml"), f"--dflash-report={reports}",
            "suites/mini")
    assert pytester.runpytest_subprocess(*args).ret == 0
    first = json.loads((reports / "fleet-summary.json").read_text())
    assert pytester.runpytest_subprocess(*args).ret == 0
    trend = json.loads((reports / "fleet-summary.json").read_text())["trend"]
    assert trend["previous"]["run_ids"] == first["run_ids"] and trend["previous"]["generated"] == first["generated"]
