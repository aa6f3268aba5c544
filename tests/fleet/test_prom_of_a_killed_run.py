"""A run killed outright (SIGKILL: an OOM kill, a CI timeout's kill -9) never reaches its end: the Prometheus
textfiles (the report dir's fleet.prom and --prometheus FILE, a node_exporter textfile) must not keep the last
run's `dflash_host_pass 1` (a review of issues 39-41: the verdict file said 'interrupted', fleet.prom still
said pass)."""

from __future__ import annotations

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
