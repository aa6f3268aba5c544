"""docs/architecture.md against the tree: the package order holds (tools/check_imports.py), and the module table
names every package and module of pytest_dflash, and nothing else."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_dflash"
DOC = ROOT / "docs" / "architecture.md"
TOOL = ROOT / "tools" / "check_imports.py"


def _check(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_package_has_no_cycle_and_imports_only_down_the_documented_order() -> None:
    result = _check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no module or package cycles" in result.stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


ORDER = "# tiny\n\n## Package order\n\n1. `__init__.py` — nothing\n2. `low/` — the bottom\n3. `high/` — the top\n"


def test_a_lazy_import_upwards_is_an_upward_edge_and_a_cycle_named_by_file_and_line(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "def f():\n    from pkg.high import b\n    return b\n",
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "from pkg.low import a\n",
        "docs/architecture.md": ORDER,
    })
    result = _check(tmp_path / "pkg")
    assert result.returncode == 1, result.stdout
    out = result.stdout
    assert "module cycle 1: pkg.high.b, pkg.low.a" in out
    assert "package cycle 1: high/, low/" in out
    assert "upward: pkg/low/a.py:2: pkg.low.a imports pkg.high.b (lazy)" in out
    assert "pkg/high/b.py:1: pkg.high.b imports pkg.low.a" in out
    assert "upward: pkg/high" not in out  # high may import low: it is listed after it
    # counting only what runs on import, the same package has no cycle (the old check's blind spot)
    assert _check(tmp_path / "pkg", "--import-time").returncode == 0


def test_a_type_only_import_upwards_fails_without_any_cycle(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..high.b import Thing\n",
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "class Thing: ...\n",
        "order.md": ORDER,
    })
    result = _check(tmp_path / "pkg", "--doc", tmp_path / "order.md")
    assert result.returncode == 1, result.stdout
    assert "upward: pkg/low/a.py:4: pkg.low.a imports pkg.high.b (type-only)" in result.stdout
    assert "cycle" not in result.stdout


def test_the_order_and_the_tree_cannot_disagree(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/extra.py": "",
        "order.md": ORDER,
    })
    result = _check(tmp_path / "pkg", "--doc", tmp_path / "order.md")
    assert result.returncode == 1, result.stdout
    assert "order: extra.py is in the tree but not in the package order" in result.stdout
    assert "order: high/ is in the package order but not in the tree" in result.stdout


def _table_modules(doc: str) -> list[str]:
    """The first column of the table under '## Modules'."""
    section = doc.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)


def _tree_modules() -> dict[str, Path]:
    """Every package (as `dir/`) and module of pytest_dflash, as the table spells it."""
    names: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and path.parent != PACKAGE:
            rel = rel.removesuffix("__init__.py")
        names[rel] = path
    return names


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "TODO: what it holds"
    return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")


def test_the_module_table_names_every_module_and_nothing_else() -> None:
    listed = _table_modules(DOC.read_text(encoding="utf-8"))
    tree = _tree_modules()
    missing = [name for name in tree if name not in listed]
    extra = [name for name in listed if name not in tree]
    twice = sorted({name for name in listed if listed.count(name) > 1})
    problems = []
    if missing:
        problems.append("missing from the module table of docs/architecture.md (add these lines):\n"
                        + "\n".join(f"| `{name}` | {_summary(tree[name])} |" for name in missing))
    if extra:
        problems.append("named in the module table but not in pytest_dflash/ (remove these lines):\n"
                        + "\n".join(f"| `{name}` |" for name in extra))
    if twice:
        problems.append("named twice in the module table: " + ", ".join(twice))
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize("name", ["config/", "config/options.py", "hostaccess/probes/kernels.py", "__init__.py"])
def test_the_table_spells_modules_as_the_tree_does(name: str) -> None:
    assert name in _tree_modules()
    assert name in _table_modules(DOC.read_text(encoding="utf-8"))
