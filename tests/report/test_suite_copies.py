"""A copy of one of pytest-dflash's suites (vendored, or kept from an older release) that lacks some of its
checks claims the suite's name in the scope and the gate line: the checks it lacks are checks left out, and a
gate refuses the run naming them (a review of issue 39 item 3: a copy of suites/smoke without
test_structured_output, attached to a `--grammar-backend none` server, gave `gate service,generation:
PASSED`, exit 0). A suite of one's own under its own name is a declared scope as before."""

from __future__ import annotations

import pytest
from support.pytest_runs import EXTERNAL_DFLASH_PROFILE, verdict

# one check of the real smoke suite, by its real name; the copy defines none of the others
COPY = """
import pytest

@pytest.mark.host
def test_host_reachable(dflash_host):
    pass
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, suite: str) -> pytest.RunResult:
    monkeypatch.setenv("DFLASH_STATE_DIR", str(pytester.path / "state"))
    for name in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    (pytester.path / "suites" / suite).mkdir(parents=True)
    (pytester.path / "suites" / suite / "test_smoke.py").write_text(COPY)
    (pytester.path / "gpu-a.toml").write_text(EXTERNAL_DFLASH_PROFILE)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", str(pytester.path / "gpu-a.toml"),
                                         f"--dflash-report={pytester.path / 'reports'}", f"suites/{suite}",
                                         "--gate", "host")


def test_a_copy_of_smoke_without_its_checks_refuses_the_gate(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "smoke")
    assert result.ret == 1, result.stdout.str()[-3000:]
    data = verdict(pytester.path / "reports", "gpu-a")
    assert data["verdict"] == "partial", data["verdict"]
    missing = data["tests"]["uncollected"]
    assert "pytest_dflash.suites.smoke: test_smoke.py::test_structured_output (the copy at " in "\n".join(
        missing), missing
    assert not any("test_host_reachable" in m for m in missing), missing
    assert data["gate"]["passed"] is False
    result.stdout.fnmatch_lines(["gate host: FAILED*", "  gate refused: gpu-a: * check(s) were never collected "
                                 "(first: pytest_dflash.suites.smoke: *): a copy of pytest-dflash's suite lacks *"])


def test_a_suite_of_ones_own_under_its_own_name_passes(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "mysmoke")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert verdict(pytester.path / "reports", "gpu-a")["verdict"] == "pass"
