"""Every third-party module the package imports is declared: in the base install, or in the extra whose code
imports it. Two checks, because neither sees all of it:

- deptry (pinned in [dev], configured in pyproject's [tool.deptry]) reads every import statement, lazy ones in
  functions too, and fails on a module no requirement provides (DEP001), one only a dependency of a dependency
  provides (DEP003: it can vanish with the next release of that dependency), and one only [dev] provides
  (DEP004: jsonschema, imported by the generation layer, once was). It cannot tell which extra a module's code
  belongs to.
- An import walk in the fresh venvs of a real install: the base install imports every module of the package
  and its suites but the refserver's, with no torch, fastapi or grammar library present (they are imported only
  where they are used); the [refserver] install imports the refserver's modules too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from install_venvs import ROOT, clean_env, run

# Prints the modules that failed to import, one "module: error" line each; none is the pass.
WALK = """
import importlib, pkgutil, sys
import pytest_dflash, pytest_dflash.suites
skip = tuple(sys.argv[1:])
failed = []
for info in pkgutil.walk_packages(pytest_dflash.__path__, "pytest_dflash."):
    name = info.name
    if name.startswith("pytest_dflash.hostaccess.probes") or name.startswith(skip):
        continue  # the probes run on the host under test, by its python
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
print("\\n".join(failed))
"""
# What the controller must not need: the reference host's stack and the grammar judge.
NOT_IN_BASE = ("torch", "fastapi", "uvicorn", "xgrammar", "transformers", "triton")


def test_deptry_finds_every_import_declared_and_none_only_in_dev() -> None:
    done = run(sys.executable, "-m", "deptry", "pytest_dflash", "suites", cwd=ROOT, timeout=120, check=False,
               env=clean_env({"NO_COLOR": "1"}))
    assert "No module named deptry" not in done.stderr, "deptry is in [dev]: pip install -e '.[dev]'"
    assert done.returncode == 0, f"deptry (pyproject [tool.deptry]):\n{done.stdout[-6000:]}{done.stderr[-3000:]}"


@pytest.mark.timeout(900)  # the first test of a run to need a venv builds it
def test_the_base_install_imports_every_module_but_the_refservers_without_torch(base_venv: Path,
                                                                                elsewhere: Path) -> None:
    python = base_venv / "bin" / "python"
    absent = run(python, "-c", "import importlib.util as u; "
                 f"print(' '.join(m for m in {NOT_IN_BASE!r} if u.find_spec(m)))", cwd=elsewhere, timeout=60)
    assert absent.stdout.strip() == "", f"the base install pulled in {absent.stdout.strip()}"
    failed = run(python, "-c", WALK, "pytest_dflash.refserver", cwd=elsewhere, timeout=300).stdout.strip()
    assert failed == "", f"modules a plain `pip install pytest-dflash` cannot import:\n{failed}"


@pytest.mark.heavy
@pytest.mark.timeout(900)  # the first test of a run to need a venv builds it (~1-2 min, 2.3 GB)
def test_the_refserver_install_imports_every_module(refserver_venv: Path, elsewhere: Path) -> None:
    failed = run(refserver_venv / "bin" / "python", "-c", WALK, cwd=elsewhere, timeout=300).stdout.strip()
    assert failed == "", f"modules `pip install 'pytest-dflash[refserver]'` cannot import:\n{failed}"
