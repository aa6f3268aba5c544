"""The checks a run was meant to make, read from the suite modules' source, against the tests collection
really produced: a check that became no test for a host — an `-o python_functions=…` / `python_classes` /
`python_files` override, a conftest's pytest_pycollect_makeitem or pytest_ignore_collect, `--ignore`,
`--ignore-glob` — is named, never left out in silence, whether the run named its suites by path (`suites`)
or by package (`--pyargs pytest_dflash.suites`). Deselection after collection (-k, -m, a conftest that drops
items) is counted elsewhere (report/session.py's SelectionRecorder); a check that does not apply to a host
is a skipped test of that host (run/collection.py), so it is produced all the same.

Which modules: every suite module collected (under a `suites/` folder), and every other module that produced
at least one dflash test; which files: the test files under each suites/ folder (or suite of it) the run
named.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeGuard

import pytest

from pytest_dflash.report.scope import installed_suites_root, package_path, suite_of
from pytest_dflash.run.collection import item_info

# pytest's own defaults: a run that changes one of them collects other tests than its suites define
COLLECTION_INI = {"python_files": ["test_*.py", "*_test.py"], "python_classes": ["Test"],
                  "python_functions": ["test"]}
ANY_HOST = ""  # a test of no host (no dflash fixture): produced for every host


def defined_checks(path: Path) -> list[str]:
    """'test_x' and 'TestY::test_z' for each test function a module defines at its top level or in a Test
    class (by pytest's default names; a fixture is no test), read from its source without importing it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []  # a module that cannot be read is a collection error of its own
    names: list[str] = []
    for node in tree.body:
        if _is_test(node):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names += [f"{node.name}::{child.name}" for child in node.body if _is_test(child)]
    return list(dict.fromkeys(names))  # a name defined twice is one test (the last definition)


def _is_test(node: ast.stmt) -> TypeGuard[ast.FunctionDef | ast.AsyncFunctionDef]:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test"):
        return False
    return not any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)


def check_name(item: pytest.Item) -> str:
    """'test_x' for 'suites/smoke/test_smoke.py::test_x[local/dflash]' ('TestY::test_z' in a class)."""
    return item.nodeid.split("[", 1)[0].split("::", 1)[-1]


def _argument_path(arg: str, invocation_dir: Path, pyargs: bool) -> Path:
    text = str(arg).split("::", 1)[0]
    path = Path(text) if Path(text).is_absolute() else invocation_dir / text
    if pyargs and not path.exists():
        path = package_path(text) or path
    return path


def _suite_root(path: Path) -> Path | None:
    """The suite folder (suites/<name>) a file lies in, or None."""
    return next((parent for parent in path.parents if parent.parent.name == "suites"), None)


def files_of_suites(args: Iterable[str], invocation_dir: Path, *,
                    pyargs: bool = False) -> list[tuple[str, Path]]:
    """(argument, suite folder) for each argument that names one file of a suite by itself (no node id): the
    suite is the scope it declares (report/scope.py), so the suite's other files are checks it left out."""
    named = []
    for arg in args:
        path = _argument_path(arg, invocation_dir, pyargs)
        if "::" not in str(arg) and path.is_file() and (root := _suite_root(path.resolve())) is not None:
            named.append((str(arg), root))
    return named


def suite_files(args: Iterable[str], invocation_dir: Path, *, pyargs: bool = False) -> set[Path]:
    """The test files under each argument that is a suites/ folder or one suite of it, or a file of a suite
    named by itself (the suite is its scope: its other files count too; a node id or any other folder: none).
    Under --pyargs a package or module name counts as its folder or file (`pytest_dflash.suites` is
    site-packages/pytest_dflash/suites for a wheel), as pytest collects it."""
    found: set[Path] = set()
    args = list(args)
    for _, root in files_of_suites(args, invocation_dir, pyargs=pyargs):
        found |= {f.resolve() for f in root.rglob("test_*.py")}
    for arg in args:
        path = _argument_path(arg, invocation_dir, pyargs)
        if not path.is_dir():
            continue
        if path.resolve().name == "suites":
            found |= {f.resolve() for f in path.glob("*/**/test_*.py")}
        elif path.resolve().parent.name == "suites":
            found |= {f.resolve() for f in path.rglob("test_*.py")}
    return found


def uncollected(modules: Mapping[Path, str], files: Iterable[Path], items: Iterable[pytest.Item],
                hosts: Sequence[str], rootpath: Path) -> dict[str, list[str]]:
    """Host -> the checks collection produced no test of for that host: each check of `modules` (module path
    -> its node id) with no test of that host among `items` (every test a collector made, before any
    deselection), then each of `files` (test files no module was collected from)."""
    produced: dict[tuple[Path, str], set[str]] = {}
    for item in items:
        info = item_info(item)
        produced.setdefault((Path(str(item.path)).resolve(), check_name(item)), set()).add(
            info.host if info is not None else ANY_HOST)
    missing: dict[str, list[str]] = {host: [] for host in hosts}
    for path, nodeid in modules.items():
        for name in defined_checks(path):
            got = produced.get((path.resolve(), name), set())
            for host in hosts:
                if ANY_HOST not in got and host not in got:
                    missing[host].append(f"{nodeid}::{name}")
    for file in sorted(files):
        for host in hosts:
            missing[host].append(f"{_relative(file, rootpath)} (no test of it was collected)")
    return {host: checks for host, checks in missing.items() if checks}


def copies_without(modules: Iterable[Path], installed: Path | None = None) -> list[str]:
    """The checks pytest-dflash's own suite S defines that a copy of it lacks: a `suites/S` folder elsewhere
    (vendored, or kept from an older release) claims S's name in the scope and the gate line, so a check it
    dropped (smoke's constrained request) is a check left out, not a suite of one's own (that has its own
    name). Each as 'pytest_dflash.suites.S: FILE::CHECK (the copy at PATH lacks it)'."""
    installed = installed if installed is not None else installed_suites_root()
    if installed is None or not installed.is_dir():
        return []
    copies: dict[Path, str] = {}  # the copy's suite folder -> the suite it is named after
    for path in modules:
        if (suite := suite_of(path)) is None or not (installed / suite).is_dir():
            continue
        root = next(p for p in path.parents if p.name == suite and p.parent.name == "suites")
        if root.resolve() != (installed / suite).resolve():
            copies[root] = suite
    missing: list[str] = []
    for root, suite in sorted(copies.items()):
        for canonical in sorted((installed / suite).rglob("test_*.py")):
            relative = canonical.relative_to(installed / suite)
            have = set(defined_checks(root / relative)) if (root / relative).is_file() else set()
            missing += [f"pytest_dflash.suites.{suite}: {relative.as_posix()}::{name} (the copy at {root} "
                        "lacks it)" for name in defined_checks(canonical) if name not in have]
    return missing


def why_uncollected(config: pytest.Config, *, copies: bool = False) -> str:
    """What made checks into no tests, as far as the options say; else where to look (`copies`: a copy of a
    suite lacks some; copies_without)."""
    if copies:
        return ("a copy of pytest-dflash's suite lacks checks the installed one defines: run the installed "
                "suite (--pyargs pytest_dflash.suites.NAME), or name a suite of one's own otherwise")
    changed = [f"{name} = {' '.join(map(str, value))!r}" for name, default in COLLECTION_INI.items()
               if list(value := config.getini(name)) != default]
    if changed:
        return f"the run collects other tests than its suites define: {', '.join(changed)}"
    ignored = [f"{flag} {' '.join(map(str, value))}" for flag, name in (("--ignore", "ignore"),
                                                                       ("--ignore-glob", "ignore_glob"))
               if (value := config.getoption(name, None))]
    if ignored:
        return f"the run left them out: {', '.join(ignored)}"
    invocation = config.invocation_params
    files = files_of_suites(invocation.args, Path(str(invocation.dir)),
                            pyargs=bool(getattr(config.option, "pyargs", False)))
    if files:
        return "; ".join(f"the run named one file of suite {root.name} ({arg}): name the suite's folder to "
                         "run all of it" for arg, root in files)
    return ("a conftest or plugin made them no test (pytest_pycollect_makeitem, pytest_ignore_collect, "
            "collect_ignore, norecursedirs)")


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(os.path.relpath(path, root)).as_posix()
    except ValueError:
        return str(path)
