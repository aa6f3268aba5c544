"""In real pytest runs (host-layer tests only, no server): ways a run that did not check what it should could
still end with a `pass` verdict or an open gate — a blocked part of the plugin, an internal error, an xfail
marker on a failing check, a rerun that erases a failure, a plugin that rewrites a failure into a pass, a check
that collection never produced — each closed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from support.pytest_runs import EXTERNAL_DFLASH_PROFILE, external_host, run_on_profile, verdict

TEST_FILE = """
import os
import pytest

@pytest.mark.host
def test_host(dflash_host):
    pass

@pytest.mark.host
def test_probe(dflash_host):
    assert not os.environ.get("FAIL_PROBE"), "the probe said no"
"""


@pytest.fixture
def profile(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("FAIL_PROBE", raising=False)
    return external_host(pytester, monkeypatch, TEST_FILE)


_run = run_on_profile


def _verdict(pytester: pytest.Pytester) -> dict[str, Any]:
    return verdict(pytester.path / "reports", "gpu-a")


def _passes_first(pytester: pytest.Pytester, profile: Path) -> None:
    """An earlier, passing run: its `pass` must not survive what comes next."""
    assert _run(pytester, profile, "--gate", "host").ret == 0
    assert _verdict(pytester)["verdict"] == "pass"


# ---- a part of the plugin blocked with -p no: ----------------------------------------------------------------

@pytest.mark.parametrize("part", ["dflash-verdicts", "dflash-selection", "dflash-xdist", "pytest_dflash.report.started",
                                  "pytest_dflash.layers.perf.hooks"])
@pytest.mark.parametrize("where", ["argument", "PYTEST_ADDOPTS"])
def test_blocking_a_part_the_verdict_needs_is_a_usage_error(pytester: pytest.Pytester, profile: Path,
                                                            monkeypatch: pytest.MonkeyPatch, part: str,
                                                            where: str) -> None:
    _passes_first(pytester, profile)
    monkeypatch.setenv("FAIL_PROBE", "1")
    if where == "PYTEST_ADDOPTS":
        monkeypatch.setenv("PYTEST_ADDOPTS", f"-p no:{part}")
        result = _run(pytester, profile, "--gate", "host")
    else:
        result = _run(pytester, profile, "--gate", "host", "-p", f"no:{part}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([f"ERROR: -p no:{part}: pytest-dflash cannot judge a run without this part *"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    data = _verdict(pytester)
    assert data["verdict"] == "interrupted" and f"-p no:{part}" in data["interrupted"], data


@pytest.mark.parametrize("part", ["dflash-progress", "dflash-html", "dflash-junit-evidence"])
def test_blocking_a_part_that_only_shows_things_changes_no_verdict(pytester: pytest.Pytester, profile: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   part: str) -> None:
    extra = ["--html", str(pytester.path / "r.html")] if part == "dflash-html" else (
        ["--junitxml", str(pytester.path / "j.xml")] if part == "dflash-junit-evidence" else [])
    passing = _run(pytester, profile, "--gate", "host", "-p", f"no:{part}", *extra)
    assert passing.ret == 0, passing.stdout.str()
    assert _verdict(pytester)["verdict"] == "pass"
    monkeypatch.setenv("FAIL_PROBE", "1")
    failing = _run(pytester, profile, "--gate", "host", "-p", f"no:{part}", *extra)
    assert failing.ret == 1, failing.stdout.str()
    failing.stdout.fnmatch_lines(["gate host: FAILED on gpu-a"])
    assert _verdict(pytester)["verdict"] == "fail"


# ---- an internal error -----------------------------------------------------------------------------------------

CONFTEST_BOOM = """
import os
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if os.environ.get("BOOM") == "configure":
        raise RuntimeError("boom in configure")

def pytest_collection_finish(session):
    if os.environ.get("BOOM") == "collection":
        raise RuntimeError("boom in collection")

@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    if os.environ.get("BOOM") == "sessionfinish":
        raise RuntimeError("boom after the verdicts")
"""


@pytest.mark.parametrize("phase", ["configure", "collection", "sessionfinish"])
def test_an_internal_error_never_leaves_a_pass(pytester: pytest.Pytester, profile: Path,
                                               monkeypatch: pytest.MonkeyPatch, phase: str) -> None:
    """Before the run's start wrote its `interrupted` verdicts (a conftest's tryfirst pytest_configure), during
    the run, or after its end wrote the final ones (a trylast pytest_sessionfinish of a conftest)."""
    pytester.makeconftest(CONFTEST_BOOM)
    _passes_first(pytester, profile)
    monkeypatch.setenv("BOOM", phase)
    result = _run(pytester, profile, "--gate", "host")
    assert result.ret != 0, result.stdout.str()
    data = _verdict(pytester)
    assert data["verdict"] == "interrupted", data
    assert "internal error" in data["interrupted"], data["interrupted"]


# ---- an xfail marker added onto a check ------------------------------------------------------------------------

CONFTEST_XFAIL = """
import os
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        if "test_probe" in item.nodeid:
            item.add_marker(pytest.mark.xfail(strict=os.environ.get("STRICT") == "1",
                                              run=os.environ.get("NOT_RUN") != "1"))
"""


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_failing_check_marked_xfail_fails_its_host(pytester: pytest.Pytester, profile: Path,
                                                     monkeypatch: pytest.MonkeyPatch, workers: list[str]) -> None:
    from pytest_dflash.fleet.verdicts import inconsistency

    pytester.makeconftest(CONFTEST_XFAIL)
    monkeypatch.setenv("FAIL_PROBE", "1")
    result = _run(pytester, profile, "--gate", "host", "--junitxml", str(pytester.path / "junit.xml"), *workers)
    assert result.ret == 1, result.stdout.str()
    junit = ElementTree.parse(pytester.path / "junit.xml")
    probe = next(case for case in junit.iter("testcase") if case.get("name") == "test_probe[gpu-a]")
    assert {p.get("name"): p.get("value") for p in probe.iter("property")}["dflash.verdict"] == "failed"
    result.stdout.fnmatch_lines(["*1 xfailed*"])  # pytest's own count: it was xfailed, not failed
    result.stdout.fnmatch_lines(["gpu-a: FAIL *", "    FAILED test_hosts.py::test_probe[[]gpu-a[]]: xfail-marked: "
                                 "AssertionError: the probe said no", "gate host: FAILED on gpu-a"])
    data = _verdict(pytester)
    assert data["verdict"] == "fail" and inconsistency(data) is None, data
    assert [f["message"] for f in data["failures"]] == ["xfail-marked: AssertionError: the probe said no"]
    assert data["layers"]["host"]["skipped"] == 0, data["layers"]


@pytest.mark.parametrize("shape", ["not-run", "strict-xpass"])
def test_an_xfail_marker_that_skips_a_check_or_a_strict_xpass_is_no_pass(pytester: pytest.Pytester, profile: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         shape: str) -> None:
    pytester.makeconftest(CONFTEST_XFAIL)
    monkeypatch.setenv("NOT_RUN" if shape == "not-run" else "STRICT", "1")
    result = _run(pytester, profile, "--gate", "host")
    assert result.ret == 1, result.stdout.str()
    data = _verdict(pytester)
    assert data["verdict"] == "fail", data
    assert data["failures"][0]["test"] == "test_hosts.py::test_probe[gpu-a]", data["failures"]


def test_a_check_that_passes_under_a_lenient_xfail_marker_passes(pytester: pytest.Pytester, profile: Path) -> None:
    """An xpass that is not strict: the check ran and passed, and that is what the verdict counts."""
    pytester.makeconftest(CONFTEST_XFAIL)
    result = _run(pytester, profile, "--gate", "host")
    assert result.ret == 0, result.stdout.str()
    assert _verdict(pytester)["verdict"] == "pass"


# ---- a rerun (pytest-rerunfailures) ----------------------------------------------------------------------------

FLAKY_FILE = """
import os
from pathlib import Path
import pytest

@pytest.mark.host
def test_flaky(dflash_host):
    flag = Path(os.environ["FLAKY_FLAG"])
    if not flag.exists():
        flag.write_text("failed once")
        assert False, "the first attempt failed"
"""


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_check_that_passed_only_on_a_rerun_is_a_failure(pytester: pytest.Pytester, profile: Path,
                                                          monkeypatch: pytest.MonkeyPatch, workers: list[str]) -> None:
    from pytest_dflash.fleet.verdicts import inconsistency

    pytester.makepyfile(test_flaky=FLAKY_FILE)
    monkeypatch.setenv("FLAKY_FLAG", str(pytester.path / "flaky.flag"))
    result = _run(pytester, profile, "--gate", "host", "--reruns", "1", *workers)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["gate host: FAILED on gpu-a", "*1 rerun*"])
    data = _verdict(pytester)
    assert data["verdict"] == "fail" and inconsistency(data) is None, data
    assert [(f["test"], f["message"]) for f in data["failures"]] == [
        ("test_flaky.py::test_flaky[gpu-a]", "flaky: failed, then run again: AssertionError: the first attempt failed")]


# ---- a plugin that rewrites a failing check's report into a pass ----------------------------------------------

CONFTEST_FORGE = """
import pytest

@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" and report.failed:
        report.outcome, report.longrepr = "passed", None  # "known flaky on this host"
    return report
"""


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_plugin_that_forges_a_pass_does_not_pass_the_host(pytester: pytest.Pytester, profile: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             workers: list[str]) -> None:
    """pytest itself counts the forged report as passed; the verdict counts what the check raised."""
    from pytest_dflash.fleet.verdicts import inconsistency

    pytester.makeconftest(CONFTEST_FORGE)
    monkeypatch.setenv("FAIL_PROBE", "1")
    result = _run(pytester, profile, "--gate", "host", *workers)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*2 passed*"])  # pytest's own count: the forged report
    result.stdout.fnmatch_lines(["gpu-a: FAIL *", "    FAILED test_hosts.py::test_probe[[]gpu-a[]]: reported as a pass "
                                 "by a plugin, but the check raised AssertionError: the probe said no",
                                 "gate host: FAILED on gpu-a"])
    data = _verdict(pytester)
    assert data["verdict"] == "fail" and inconsistency(data) is None, data


def test_a_forging_plugin_leaves_a_passing_check_a_pass(pytester: pytest.Pytester, profile: Path) -> None:
    """The healthy case: nothing raised, nothing to forge."""
    pytester.makeconftest(CONFTEST_FORGE)
    assert _run(pytester, profile, "--gate", "host").ret == 0
    assert _verdict(pytester)["verdict"] == "pass"


# ---- a plugin that answers a check's call without running it -------------------------------------------------

CONFTEST_SHORT_CIRCUIT = {
    "pyfunc_call": """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if "test_probe" in pyfuncitem.nodeid:
        return True  # "known flaky on this host": answered, never called
""",
    "runtest": """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if "test_probe" in item.nodeid:
        item.runtest = lambda: None
""",
}


@pytest.mark.parametrize("how", list(CONFTEST_SHORT_CIRCUIT))
@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_check_whose_function_never_ran_does_not_pass_the_host(pytester: pytest.Pytester, profile: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, how: str,
                                                                 workers: list[str]) -> None:
    """Before: a conftest whose pytest_pyfunc_call returned True for the failing check (or that replaced its
    runtest) gave `gate host: PASSED`, exit 0: the check's function never ran, so it had no evidence to pass on."""
    pytester.makeconftest(CONFTEST_SHORT_CIRCUIT[how])
    monkeypatch.setenv("FAIL_PROBE", "1")
    result = _run(pytester, profile, "--gate", "host", *workers)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["gpu-a: FAIL *", "*test_probe*the check's function never ran*",
                                 "gate host: FAILED on gpu-a"])
    assert _verdict(pytester)["verdict"] == "fail"


def test_a_check_whose_function_ran_passes_beside_such_a_plugin(pytester: pytest.Pytester, profile: Path) -> None:
    """The healthy case: the plugin leaves test_host alone, which runs and passes."""
    pytester.makeconftest(CONFTEST_SHORT_CIRCUIT["pyfunc_call"].replace("test_probe", "test_nothing"))
    assert _run(pytester, profile, "--gate", "host").ret == 0
    assert _verdict(pytester)["verdict"] == "pass"


# ---- a check that collection never made a test of ------------------------------------------------------------

SUITE_FILE = """
import pytest

@pytest.mark.host
def test_host(dflash_host):
    pass

@pytest.mark.host
def test_accept_length(dflash_host):
    pass

@pytest.fixture
def test_data():  # a fixture named like a test is no check
    return 1
"""
SECOND_SUITE_FILE = """
import pytest

@pytest.mark.host
def test_second(dflash_host):
    pass
"""
CONFTEST_MAKEITEM = """
import os
import pytest

def pytest_pycollect_makeitem(collector, name, obj):
    if os.environ.get("DROP") == "check" and name == "test_accept_length":
        return []


class OneHost:
    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makeitem(self, collector, name, obj):
        made = yield
        if name == "test_accept_length":
            return [item for item in made or () if "gpu-b" not in getattr(item, "name", "")]
        return made


def pytest_configure(config):
    if os.environ.get("DROP") == "one-host":
        config.pluginmanager.register(OneHost(), "one-host")
"""


@pytest.fixture
def suites(pytester: pytest.Pytester, profile: Path) -> Path:
    """Two suites (suites/mini, suites/second), and a second host (gpu-b) beside gpu-a."""
    (pytester.path / "test_hosts.py").unlink()
    for suite, text in (("mini", SUITE_FILE), ("second", SECOND_SUITE_FILE)):
        (pytester.path / "suites" / suite).mkdir(parents=True)
        (pytester.path / "suites" / suite / f"test_{suite}.py").write_text(text)
    (pytester.path / "gpu-b.toml").write_text(EXTERNAL_DFLASH_PROFILE)
    return pytester.path / "suites"


def _run_suites(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("suites", "-p", "no:cacheprovider", "--host", "gpu-a.toml", "--host",
                                         "gpu-b.toml", f"--dflash-report={pytester.path / 'reports'}", "--gate",
                                         "host", *args)


def _verdicts(pytester: pytest.Pytester) -> dict[str, dict[str, Any]]:
    return {host: json.loads((pytester.path / "reports" / f"{host}.verdict.json").read_text())
            for host in ("gpu-a", "gpu-b")}


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_whole_run_of_the_suites_passes(pytester: pytest.Pytester, suites: Path, workers: list[str]) -> None:
    result = _run_suites(pytester, *workers)
    assert result.ret == 0, result.stdout.str()
    assert {h: v["verdict"] for h, v in _verdicts(pytester).items()} == {"gpu-a": "pass", "gpu-b": "pass"}


@pytest.mark.parametrize(("shape", "first", "why"), [
    (["-o", "python_functions=test_host test_second"], "suites/mini/test_mini.py::test_accept_length",
     "the run collects other tests than its suites define: python_functions = 'test_host test_second'"),
    (["-o", "python_classes=Nothing", "-o", "python_functions=test_h test_s"],
     "suites/mini/test_mini.py::test_accept_length",
     "the run collects other tests than its suites define: python_classes = 'Nothing', python_functions = "
     "'test_h test_s'"),
    (["-o", "python_files=test_mini.py"], "suites/second/test_second.py (no test of it was collected)",
     "the run collects other tests than its suites define: python_files = 'test_mini.py'"),
    (["--ignore", "suites/second/test_second.py"], "suites/second/test_second.py (no test of it was collected)",
     "the run left them out: --ignore suites/second/test_second.py"),
    (["-o", "norecursedirs=second"], "suites/second/test_second.py (no test of it was collected)",
     "a conftest or plugin made them no test *"),
    (["DROP=check"], "suites/mini/test_mini.py::test_accept_length", "a conftest or plugin made them no test *"),
], ids=["python_functions", "python_classes", "python_files", "ignore", "norecursedirs", "makeitem"])
@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_check_collection_never_made_is_named_and_fails_the_gate(
        pytester: pytest.Pytester, suites: Path, monkeypatch: pytest.MonkeyPatch, shape: list[str], first: str,
        why: str, workers: list[str]) -> None:
    pytester.makeconftest(CONFTEST_MAKEITEM)
    if shape[0].startswith("DROP="):
        monkeypatch.setenv("DROP", shape[0].removeprefix("DROP="))
        shape = []
    result = _run_suites(pytester, *shape, *workers)
    assert result.ret == 1, result.stdout.str()
    reason = f"1 check(s) of this host were never collected (first: {first}): {why}"
    result.stdout.fnmatch_lines(["gpu-a: PARTIAL *", f"    PARTIAL: {reason}", "gate host: FAILED",
                                 f"  gate refused: gpu-a: 1 check(s) were never collected (first: {first}): *"])
    for data in _verdicts(pytester).values():
        assert data["verdict"] == "partial", data
        assert data["tests"]["deselected"] == 0 and data["tests"]["uncollected"] == [first], data["tests"]


def test_a_check_made_for_one_host_only_leaves_the_other_partial(pytester: pytest.Pytester, suites: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Per host, as run/collection.py parametrizes: a hook that keeps a check's test of gpu-a and drops gpu-b's."""
    pytester.makeconftest(CONFTEST_MAKEITEM)
    monkeypatch.setenv("DROP", "one-host")
    result = _run_suites(pytester)
    assert result.ret == 1, result.stdout.str()
    verdicts = _verdicts(pytester)
    assert verdicts["gpu-a"]["verdict"] == "pass", verdicts["gpu-a"]
    assert verdicts["gpu-b"]["verdict"] == "partial", verdicts["gpu-b"]
    assert verdicts["gpu-b"]["tests"]["uncollected"] == ["suites/mini/test_mini.py::test_accept_length"]
