"""What a run declared it checks (its scope) and how it narrowed itself inside that scope.

Choosing suites is a declaration, not a narrowing: `pytest suites/smoke` (the deploy gate's suite),
`pytest suites/generation`, `pytest --pyargs pytest_dflash.suites.perf` or a folder of one's own each
declare a scope, which the verdict and the gate line name ("scope: generation (1 of 8 suites)"). Inside
the scope, anything that leaves a check out — -k, -m, --lf, --deselect, node ids, --ignore, one file of a
suite named by itself (report/checklist.py lists the suite's other files), a conftest that drops or skips
checks — is a narrowing: the host is partial and a gate refuses it (report/verdict.py, report/gate.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SUITES_PACKAGE = "pytest_dflash.suites"


@dataclass(frozen=True)
class Scope:
    """The suites a run named (folders of test files under a `suites/` folder, by path or --pyargs), how many
    suites there are beside them, and what else it named (a folder or file outside any suites/ folder)."""

    suites: tuple[str, ...] = ()
    available: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()

    @property
    def whole(self) -> bool:
        """Every suite, and nothing else named."""
        return bool(self.suites) and set(self.available) <= set(self.suites) and not self.paths

    def text(self) -> str:
        """'generation (1 of 8 suites)', 'all 8 suites', 'tests/mine', or '' (the run named nothing known)."""
        parts = []
        if self.suites:
            count = len(set(self.available) | set(self.suites))
            parts.append(f"all {count} suites" if set(self.available) <= set(self.suites)
                         else f"{', '.join(sorted(self.suites))} ({len(self.suites)} of {count} suites)")
        parts += list(self.paths)
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"suites": list(self.suites), "available": list(self.available), "paths": list(self.paths),
                "whole": self.whole, "text": self.text()}


def suite_of(path: Path) -> str | None:
    """'smoke' for .../suites/smoke/test_smoke.py (the installed pytest_dflash/suites too); None elsewhere."""
    parts = path.parts
    for index in range(len(parts) - 2, 0, -1):
        if parts[index - 1] == "suites":
            return parts[index]
    return None


def package_path(name: str) -> Path | None:
    """Where a --pyargs name lives: a package's folder or a module's file (None: not importable)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return Path(locations[0])
    return Path(spec.origin) if spec.origin and spec.origin not in ("built-in", "frozen") else None


def installed_suites_root() -> Path | None:
    """Where `pytest_dflash.suites` lives (a wheel's site-packages, or the clone's suites/ when editable)."""
    return package_path(SUITES_PACKAGE)


def named_paths(config: pytest.Config) -> list[Path]:
    """The paths the run's arguments name (a --pyargs name resolved to its package folder or module file; a
    node id to its file), absolute."""
    base = Path(str(config.invocation_params.dir))
    pyargs = bool(getattr(config.option, "pyargs", False))
    found: list[Path] = []
    if config.args_source == pytest.Config.ArgsSource.INVOCATION_DIR:
        return found  # no argument and no testpaths: the run named nothing
    for arg in config.args or ():  # the positional arguments (or testpaths), not the options' values
        text = str(arg).split("::", 1)[0]
        if not text:
            continue
        path = Path(text) if Path(text).is_absolute() else base / text
        if not path.exists() and pyargs:
            path = package_path(text) or path
        found.append(path)
    return found


def pyargs_suites(config: pytest.Config, available: set[str]) -> set[str]:
    """The suites a --pyargs run names (pytest_dflash.suites.smoke -> smoke; pytest_dflash.suites -> all): its
    node ids are relative to the package, so they do not say."""
    if not getattr(config.option, "pyargs", False):
        return set()
    named: set[str] = set()
    for arg in config.invocation_params.args:
        parts = str(arg).split("::", 1)[0].split(".")
        if parts[:2] == ["pytest_dflash", "suites"]:
            named |= {parts[2]} if len(parts) > 2 else set(available)
    return named


def _suites_in(root: Path) -> set[str]:
    if not root.is_dir():
        return set()
    return {child.name for child in root.iterdir() if child.is_dir() and any(child.glob("test_*.py"))}


def available_suites(seen: set[str], config: pytest.Config) -> set[str]:
    """The suites that exist beside the ones this run collected (folders of test files under suites/)."""
    roots = {Path(str(config.invocation_params.dir)) / "suites"}
    installed = installed_suites_root()
    if installed is not None and getattr(config.option, "pyargs", False):
        roots.add(installed)
    for path in named_paths(config):
        roots.update(candidate for candidate in (path, *path.parents) if candidate.name == "suites")
    found: set[str] = set()
    for root in roots:
        found |= _suites_in(root)
    return found | seen


def declared_scope(config: pytest.Config, collected: set[str]) -> Scope:
    """The run's scope: the suites its arguments name (a suites/ folder names all of its suites), those its
    tests came from, and any other path it names."""
    available = available_suites(collected, config)
    suites = set(collected) | pyargs_suites(config, available)
    paths: list[str] = []
    base = Path(str(config.invocation_params.dir))
    for path in named_paths(config):
        if path.name == "suites" and path.is_dir():
            suites |= _suites_in(path)
        elif (suite := suite_of(path / "x")) is not None:  # a suite's folder, or a file or node id in it
            suites.add(suite)
        else:
            paths.append(_shown(path, base))
    return Scope(tuple(sorted(suites)), tuple(sorted(available | suites)), tuple(dict.fromkeys(paths)))


def _shown(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix() or "."
    except ValueError:
        return str(path)


def narrowed_by(config: pytest.Config) -> list[str]:
    """How the run was narrowed inside its scope by its options, in words (empty: not by its options; what
    pytest then deselected, left uncollected or skipped is counted per host)."""
    reasons = []
    option = config.option
    if getattr(option, "keyword", ""):
        reasons.append(f"-k {option.keyword!r}")
    if getattr(option, "markexpr", ""):
        reasons.append(f"-m {option.markexpr!r}")
    lastfailed = getattr(config.pluginmanager.get_plugin("lfplugin"), "lastfailed", None)
    if getattr(option, "lf", False) and lastfailed:  # with nothing failed before, --lf runs everything
        reasons.append("--lf")
    if getattr(option, "deselect", None):
        reasons.append(f"--deselect ({len(option.deselect)})")
    named = [str(a) for a in config.invocation_params.args if "::" in str(a)]
    if named:
        reasons.append(f"selected by node id ({len(named)})")
    return reasons
