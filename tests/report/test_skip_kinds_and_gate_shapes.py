"""In real pytest runs (host-layer tests only, no server): a check that could not be made leaves its host
partial and refuses a gate over its layer, also across xdist's worker -> controller reports; and a --gate given
to a run that runs no test body (--co, --setup-only, --setup-plan; PYTEST_ADDOPTS too) is a usage error that
replaces an older verdict with an interrupted one."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from support.pytest_runs import external_host, run_on_profile, verdict

TEST_FILE = """
import os
import pytest
from pytest_dflash.run import skips

@pytest.mark.host
def test_host(dflash_host):
    pass

@pytest.mark.host
def test_probe(dflash_host):
    if os.environ.get("SKIP_KIND") == "unchecked":
        skips.could_not_check("the probe did not answer")
    skips.not_applicable("nothing to probe here")
"""
# the same test id with and without xdist (issue 31, item 4)
UNCHECKED = "1 check(s) of the host layer could not be made (first: test_hosts.py::test_probe[[]gpu-a[]]: the probe " \
            "did not answer)"


@pytest.fixture
def profile(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    return external_host(pytester, monkeypatch, TEST_FILE)


_run = run_on_profile


def _verdict(pytester: pytest.Pytester) -> dict[str, object]:
    return verdict(pytester.path / "reports", "gpu-a")


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_check_that_could_not_be_made_is_partial_and_fails_the_gate(
        pytester: pytest.Pytester, profile: Path, monkeypatch: pytest.MonkeyPatch, workers: list[str]) -> None:
    monkeypatch.setenv("SKIP_KIND", "unchecked")
    gated = _run(pytester, profile, "--gate", "host", *workers)
    assert gated.ret == 1, gated.stdout.str()
    gated.stdout.fnmatch_lines(["gpu-a: PARTIAL *", f"    PARTIAL: {UNCHECKED}", "gate host: FAILED*",
                                f"  gate refused: gpu-a: {UNCHECKED}"])
    data = _verdict(pytester)
    assert data["verdict"] == "partial" and len(data["partial"]) == 1, data  # type: ignore[arg-type]
    assert fnmatch.fnmatch(data["partial"][0], UNCHECKED)  # type: ignore[index]
    assert data["layers"]["host"] == {"outcome": "passed", "passed": 1, "failed": 0,  # type: ignore[index]
                                      "blocked": 0, "skipped": 1, "unchecked": 1}
    assert [s["kind"] for s in data["skipped"]] == ["could not check"]  # type: ignore[attr-defined]
    assert not data["gate"]["passed"]  # type: ignore[index]
    assert _run(pytester, profile, *workers).ret == 0  # partial: not a failing exit without a gate

    monkeypatch.delenv("SKIP_KIND")
    innocent = _run(pytester, profile, "--gate", "host", *workers)
    assert innocent.ret == 0, innocent.stdout.str()
    assert _verdict(pytester)["verdict"] == "pass"


@pytest.mark.parametrize("shape", [["--co"], ["--collect-only"], ["--setup-only"], ["--setup-plan"]])
def test_a_gate_over_a_run_that_runs_no_test_body_is_a_usage_error(
        pytester: pytest.Pytester, profile: Path, shape: list[str]) -> None:
    assert _run(pytester, profile).ret == 0
    assert _verdict(pytester)["verdict"] == "pass"
    result = _run(pytester, profile, *shape, "--gate", "host")
    assert result.ret == 4, result.stdout.str()
    flag = "--collect-only" if shape == ["--co"] else shape[0]
    lines = [line for line in result.stderr.str().splitlines() if line.strip()]
    assert lines == [f"ERROR: --gate / dflash_gate 'host' with {flag}: a run that runs no test body tests nothing "
                     "and cannot open a gate"], lines
    data = _verdict(pytester)
    assert data["verdict"] == "interrupted", data
    assert f"with {flag}: a run that runs no test body" in str(data["interrupted"])


def test_collect_only_from_pytest_addopts_cannot_open_a_gate(pytester: pytest.Pytester, profile: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(pytester, profile).ret == 0
    monkeypatch.setenv("PYTEST_ADDOPTS", "--co")
    result = _run(pytester, profile, "--gate", "host")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --gate / dflash_gate 'host' with --collect-only (from PYTEST_ADDOPTS): *"])
    assert _verdict(pytester)["verdict"] == "interrupted"


def test_the_gate_from_the_ini_file_counts_too(pytester: pytest.Pytester, profile: Path) -> None:
    pytester.makeini("[pytest]\ndflash_gate = host\n")
    result = _run(pytester, profile, "--setup-only")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --gate / dflash_gate 'host' with --setup-only: *"])


def test_collect_only_without_a_gate_still_lists_and_leaves_the_verdict(pytester: pytest.Pytester,
                                                                          profile: Path) -> None:
    assert _run(pytester, profile).ret == 0
    listed = _run(pytester, profile, "--co")
    assert listed.ret == 0
    assert _verdict(pytester)["verdict"] == "pass"
