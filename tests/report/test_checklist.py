"""report/checklist.py: the checks a module defines, read from its source, are exactly the tests pytest makes of
it — for every real suite module (a `test*` name that is no test would leave every healthy run partial) — and a
fixture, a helper or an imported test is no check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pytest_dflash.report.checklist import defined_checks, suite_files

ROOT = Path(__file__).parents[2]


def test_every_check_of_the_real_suites_is_a_test_pytest_collects() -> None:
    listing = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--host", "local",
                              "suites"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert listing.returncode == 0, listing.stdout[-2000:] + listing.stderr[-2000:]
    collected = {line.split("[", 1)[0] for line in listing.stdout.splitlines() if "::" in line}
    defined = {f"{path.relative_to(ROOT).as_posix()}::{name}"
               for path in sorted(suite_files(["suites"], ROOT)) for name in defined_checks(path)}
    assert defined and defined == collected, (defined ^ collected)


def test_fixtures_helpers_and_imports_are_no_checks(tmp_path: Path) -> None:
    module = tmp_path / "test_module.py"
    module.write_text(
        "import pytest\n"
        "from elsewhere import test_imported\n"
        "@pytest.fixture\n"
        "def test_data():\n    return 1\n"
        "def helper():\n    pass\n"
        "def test_one(dflash_host):\n    pass\n"
        "async def test_async(dflash_host):\n    pass\n"
        "def test_one(dflash_host):\n    pass\n"  # defined twice: one test
        "class TestGroup:\n    def test_inner(self):\n        pass\n    def other(self):\n        pass\n"
        "class Group:\n    def test_not_collected(self):\n        pass\n")
    assert defined_checks(module) == ["test_one", "test_async", "TestGroup::test_inner"]
    (tmp_path / "test_broken.py").write_text("def test_(:\n")
    assert defined_checks(tmp_path / "test_broken.py") == []  # a collection error of its own


def test_suite_files_are_those_under_a_suites_folder_or_one_suite(tmp_path: Path) -> None:
    for path in ("suites/smoke/test_smoke.py", "suites/perf/test_perf.py", "suites/perf/deep/test_deep.py",
                 "suites/perf/helper.py", "tests/test_self.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    found = {p.relative_to(tmp_path.resolve()).as_posix() for p in suite_files(["suites"], tmp_path)}
    assert found == {"suites/smoke/test_smoke.py", "suites/perf/test_perf.py", "suites/perf/deep/test_deep.py"}
    assert {p.name for p in suite_files([str(tmp_path / "suites" / "perf")], tmp_path)} == {"test_perf.py",
                                                                                            "test_deep.py"}
    assert suite_files(["tests", "suites/smoke/test_smoke.py::test_x", "pytest_dflash.suites"], tmp_path) == set()
    # one file of a suite named by itself: the suite is its scope, so its other files count too
    assert {p.name for p in suite_files(["suites/perf/test_perf.py"], tmp_path)} == {"test_perf.py", "test_deep.py"}


def test_under_pyargs_a_package_name_is_its_folder(tmp_path: Path) -> None:
    """`--pyargs pytest_dflash.suites` (a wheel's site-packages/pytest_dflash/suites) names the same test files as
    the path form; before, a package name named none, so `--ignore` of a suite left no check missing."""
    by_path = suite_files(["suites"], ROOT)
    assert suite_files(["pytest_dflash.suites"], tmp_path, pyargs=True) == by_path
    assert suite_files(["pytest_dflash.suites.smoke"], tmp_path, pyargs=True) == suite_files(["suites/smoke"], ROOT)
    assert suite_files(["no.such.package"], tmp_path, pyargs=True) == set()
    assert suite_files(["pytest_dflash.suites.parity.test_parity"], tmp_path, pyargs=True) == suite_files(
        ["suites/parity"], ROOT)  # a module of a suite: the suite's files, test_acceptance.py too
