"""Print every import cycle among a package's modules; exit 1 if there is one, 0 if there is none.

    python tools/check_imports.py                 # pytest_dflash/ next to tools/
    python tools/check_imports.py path/to/pkg     # any other package directory

Reads each .py file with ast (nothing is imported). Counted: imports that run when the module is
imported, i.e. at module level, in class bodies and in module-level if/try/with blocks. Not counted:
imports inside functions (deliberate lazy imports) and under ``if TYPE_CHECKING:`` (never run).
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``; relative
imports are resolved against the importing module's package. Parent packages' ``__init__`` are not
edges of their own: every submodule would otherwise "cycle" through a package that re-exports it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Edge", "find_cycles", "import_graph", "main"]

MAX_CYCLES_PER_GROUP = 20  # a tangle of n modules can hold far more simple cycles than anyone reads


@dataclass(frozen=True)
class Edge:
    """One import statement: ``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: Path
    line: int


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package directory ``root``."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that run on import: recurse into blocks, not into functions."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _runtime_imports(node.orelse)  # the else branch does run
        else:  # class bodies and if/try/with/for/while/match blocks
            for name in ("body", "orelse", "finalbody"):
                yield from _runtime_imports(getattr(node, name, []))
            for holder in [*getattr(node, "handlers", []), *getattr(node, "cases", [])]:
                yield from _runtime_imports(holder.body)  # except handlers, match cases


def _resolve(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The package modules one import statement loads (outside modules are dropped)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        up = node.level - 1
        if up > len(package) - 1:
            return []  # beyond the top-level package: Python raises, not our concern here
        base = ".".join(package[: len(package) - up])
        base = f"{base}.{node.module}" if node.module else base
    else:
        base = node.module or ""
    targets = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            targets.append(sub)
        elif base in known:
            targets.append(base)
    return list(dict.fromkeys(targets))


def import_graph(root: Path) -> list[Edge]:
    """Every runtime import edge between the modules of the package directory ``root``."""
    known = module_names(root)
    edges = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runtime_imports(tree.body):
            for target in _resolve(module, path.name == "__init__.py", node, known):
                if target != module:
                    edges.append(Edge(module, target, path, node.lineno))
    return edges


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit to hit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    groups.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _simple_cycles(group: list[str], graph: dict[str, set[str]], limit: int) -> list[list[str]]:
    """Up to ``limit`` simple cycles inside one component, each starting at its smallest module."""
    members = set(group)
    cycles: list[list[str]] = []
    for start in group:  # cycles through start that use only modules after it: each found once
        allowed = {m for m in members if m >= start}
        path = [start]
        work = [iter(sorted(graph[start] & allowed))]
        while work and len(cycles) < limit:
            child = next(work[-1], None)
            if child is None:
                work.pop()
                path.pop()
            elif child == start:
                cycles.append([*path, start])
            elif child not in path:
                path.append(child)
                work.append(iter(sorted(graph[child] & allowed)))
    return cycles


def find_cycles(edges: list[Edge]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (size 2 or more)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    return [g for g in _strongly_connected(graph) if len(g) > 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    default = Path(__file__).resolve().parents[1] / "pytest_dflash"
    parser.add_argument("package", nargs="?", type=Path, default=default, help="package directory (%(default)s)")
    root = parser.parse_args(argv).package.resolve()
    if not (root / "__init__.py").is_file():
        parser.error(f"{root} is not a package directory (no __init__.py)")
    edges = import_graph(root)
    groups = find_cycles(edges)
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    if not groups:
        print(f"no import cycles among the {len(module_names(root))} modules of {root.name}")
        return 0
    where = root.parent
    for number, group in enumerate(groups, 1):
        print(f"cycle group {number}: {', '.join(group)}")
        for cycle in _simple_cycles(group, graph, MAX_CYCLES_PER_GROUP):
            print(f"  {' -> '.join(cycle)}")
        members = set(group)
        for e in sorted(edges, key=lambda e: (str(e.path), e.line)):
            if e.source in members and e.target in members:
                print(f"    {e.path.relative_to(where)}:{e.line}: {e.source} imports {e.target}")
    print(f"{len(groups)} import cycle group(s) in {root.name}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
