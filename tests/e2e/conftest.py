"""End-to-end self-tests: real pytest runs (pytester) of the real suites against real refserver processes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from e2e_helpers import SUITES


@pytest.fixture
def run_suite(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Run a suite in a real pytest subprocess: run_suite("smoke", "--host", profile, ...) -> (RunResult, report dir)."""
    reports = tmp_path / "reports"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)  # self-tests inside Actions: not the job's summary
    # Host locks, markers and progress files of this test's runs only: two CI workers running tests whose hosts
    # share a name (sm120, slow, ...) would otherwise wait for each other's host lock.
    monkeypatch.setenv("DFLASH_STATE_DIR", str(tmp_path / "state"))

    def run(suite: str | Sequence[str], *args: str) -> pytest.RunResult:
        suites = [suite] if isinstance(suite, str) else list(suite)
        paths = [str(SUITES / s) for s in suites]
        return pytester.runpytest_subprocess(*paths, "-p", "no:cacheprovider", f"--dflash-report={reports}",
                                  "--request-timeout=20s", *args)

    run.reports = reports  # type: ignore[attr-defined]
    return run
