"""pytest_dflash.api is the one surface suites import (httpx tests/test_exported_members.py style).

Adding a name to `__all__` is a decision, removing one a breaking change: both show up here. And the suites in
suites/ reach the plugin only through it, so a layer can move its internals without touching a suite.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pytest_dflash import api

SUITES = Path(__file__).parents[1] / "suites"
EXPORTED = [
    "DflashError",
    "GpuHost",
    "HostContext",
    "LayerOptions",
    "PerfLayer",
    "ServiceHandle",
    "acceptance",
    "coldstart",
    "distribution",
    "env",
    "explain",
    "generation",
    "host",
    "kernels",
    "parity",
    "parity_checks",
    "ready_or_blocked",
    "service_checks",
]


def test_all_is_pinned() -> None:
    assert api.__all__ == EXPORTED


def test_every_exported_name_exists() -> None:
    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert not missing, f"pytest_dflash.api.__all__ names {missing}, which the module does not define"


def _plugin_imports(path: Path) -> list[str]:
    """Every pytest_dflash module `path` imports, as 'line N: module'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module == "pytest_dflash"  # `from pytest_dflash import x` imports module x
            modules = [f"pytest_dflash.{a.name}" for a in node.names] if top else [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        found += [f"line {node.lineno}: {m}" for m in modules if m.split(".")[0] == "pytest_dflash"]
    return found


@pytest.mark.parametrize("suite", sorted(SUITES.rglob("*.py")), ids=lambda p: str(p.relative_to(SUITES)))
def test_suites_import_only_the_api(suite: Path) -> None:
    other = [line for line in _plugin_imports(suite) if not line.endswith(": pytest_dflash.api")]
    assert not other, f"{suite.relative_to(SUITES.parent)} imports plugin internals (use pytest_dflash.api): {other}"


def test_the_import_check_sees_internal_imports(tmp_path: Path) -> None:
    suite = tmp_path / "test_x.py"
    suite.write_text("import pytest_dflash.client\nfrom pytest_dflash import plugin\nfrom pytest_dflash.api import env\n"
                     "from pytest_dflash.layers.gpu.checks import gpu_health\n")
    assert _plugin_imports(suite) == ["line 1: pytest_dflash.client", "line 2: pytest_dflash.plugin", "line 3: pytest_dflash.api",
                                      "line 4: pytest_dflash.layers.gpu.checks"]
