"""Check a package's imports: no module cycle, no package cycle, and every import points down the documented
package order. Exit 1 on any finding (each names its import as file:line), 0 when there is none.

    python tools/check_imports.py                   # pytest_dflash/ against docs/architecture.md
    python tools/check_imports.py path/to/pkg       # any package; its order from path/to/docs/architecture.md
    python tools/check_imports.py pkg --doc ORDER.md  # the order from another file
    python tools/check_imports.py --import-time     # only the imports that run on import (no order check)

Reads each .py file with ast (nothing is imported). Every import statement counts: at module level, in
class bodies and blocks, inside functions (lazy) and under ``if TYPE_CHECKING:`` (type-only). A lazy or
type-only import still says one module needs another; a cycle through one is a cycle in the design even
when Python never trips over it. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
else to ``pkg``; relative imports are resolved against the importing module's package. Parent packages'
``__init__`` are not edges of their own: every submodule would otherwise "cycle" through a package that
re-exports it.

The package order is the numbered list under the ``## Package order`` heading of the doc, bottom first, one
unit a line, spelled as in the tree: a subpackage ``config/``, a top-level module ``errors.py``, the
package's own ``__init__.py``. A unit may import only units listed before it. Every unit of the tree must be
listed and every listed unit must exist: the list and the tree cannot disagree silently.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Edge", "check", "find_cycles", "import_graph", "main", "read_order", "unit_of"]

MAX_CYCLES_PER_GROUP = 20  # a tangle of n modules can hold far more simple cycles than anyone reads
ORDER_HEADING = "## Package order"
Kind = Literal["import-time", "lazy", "type-only"]


@dataclass(frozen=True)
class Edge:
    """One import statement: ``source`` imports ``target`` at ``path:line``; ``kind`` says when it runs."""

    source: str
    target: str
    path: Path
    line: int
    kind: Kind = "import-time"


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


def _imports(body: list[ast.stmt],
             kind: Kind = "import-time") -> Iterator[tuple[ast.Import | ast.ImportFrom, Kind]]:
    """Every import statement with when it runs: on import, when a function is called, or never."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, kind
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _imports(node.body, "type-only" if kind == "type-only" else "lazy")
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.body, "type-only")
            yield from _imports(node.orelse, kind)  # the else branch does run
        else:  # class bodies and if/try/with/for/while/match blocks
            for name in ("body", "orelse", "finalbody"):
                yield from _imports(getattr(node, name, []), kind)
            for holder in [*getattr(node, "handlers", []), *getattr(node, "cases", [])]:
                yield from _imports(holder.body, kind)  # except handlers, match cases


def _resolve(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             known: dict[str, Path]) -> list[str]:
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


def import_graph(root: Path, *, import_time_only: bool = False) -> list[Edge]:
    """Every import edge between the modules of the package directory ``root`` (lazy and type-only too,
    unless ``import_time_only``)."""
    known = module_names(root)
    edges = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, kind in _imports(tree.body):
            if import_time_only and kind != "import-time":
                continue
            for target in _resolve(module, path.name == "__init__.py", node, known):
                if target != module:
                    edges.append(Edge(module, target, path, node.lineno, kind))
    return edges


def unit_of(module: str, root: Path) -> str:
    """The unit of the package order a module belongs to: ``config/``, ``errors.py`` or ``__init__.py``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if (root / parts[1]).is_dir() else f"{parts[1]}.py"


def read_order(doc: Path) -> list[str]:
    """The units of the ``## Package order`` list in ``doc``, bottom first (empty when there is none)."""
    units: list[str] = []
    inside = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            inside = line.strip() == ORDER_HEADING
        elif inside and (match := re.match(r"\d+\.\s+`([^`]+)`", line)):
            units.append(match.group(1))
    return units


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


def _graph(pairs: list[tuple[str, str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for source, target in pairs:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    return graph


def find_cycles(edges: list[Edge]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (size 2 or more)."""
    return [g for g in _strongly_connected(_graph([(e.source, e.target) for e in edges])) if len(g) > 1]


def _where(edge: Edge, base: Path) -> str:
    kind = "" if edge.kind == "import-time" else f" ({edge.kind})"
    return f"{edge.path.relative_to(base)}:{edge.line}: {edge.source} imports {edge.target}{kind}"


def check(root: Path, order: list[str] | None, *, import_time_only: bool = False) -> list[str]:
    """Every finding as printable lines (empty: the package is clean). ``order`` None: not enforced."""
    edges = sorted(import_graph(root, import_time_only=import_time_only), key=lambda e: (str(e.path), e.line))
    base = root.parent
    lines: list[str] = []
    graph = _graph([(e.source, e.target) for e in edges])
    for number, group in enumerate(find_cycles(edges), 1):
        lines.append(f"module cycle {number}: {', '.join(group)}")
        lines += [f"  {' -> '.join(c)}" for c in _simple_cycles(group, graph, MAX_CYCLES_PER_GROUP)]
        members = set(group)
        lines += [f"    {_where(e, base)}" for e in edges if e.source in members and e.target in members]
    crossing = [e for e in edges if unit_of(e.source, root) != unit_of(e.target, root)]
    units = _graph([(unit_of(e.source, root), unit_of(e.target, root)) for e in crossing])
    for number, group in enumerate([g for g in _strongly_connected(units) if len(g) > 1], 1):
        lines.append(f"package cycle {number}: {', '.join(group)}")
        members = set(group)
        lines += [f"    {_where(e, base)}" for e in crossing
                  if unit_of(e.source, root) in members and unit_of(e.target, root) in members]
    if order is None:
        return lines
    present = {unit_of(m, root) for m in module_names(root)}
    lines += [f"order: {u} is in the tree but not in the package order" for u in sorted(present - set(order))]
    lines += [f"order: {u} is in the package order but not in the tree" for u in order if u not in present]
    lines += [f"order: {u} is listed twice" for u in sorted({u for u in order if order.count(u) > 1})]
    level = {u: i for i, u in enumerate(order)}
    for e in crossing:
        source, target = unit_of(e.source, root), unit_of(e.target, root)
        if source in level and target in level and level[target] >= level[source]:
            lines.append(f"upward: {_where(e, base)} ({source} may import only units listed before it; "
                         f"{target} is after it)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    default = Path(__file__).resolve().parents[1] / "pytest_dflash"
    parser.add_argument("package", nargs="?", type=Path, default=default,
                        help="package directory (%(default)s)")
    parser.add_argument("--doc", type=Path,
                        help="the file with the package order (<package>/../docs/architecture.md)")
    parser.add_argument("--import-time", action="store_true",
                        help="count only imports that run on import, and check cycles only (not the order)")
    args = parser.parse_args(argv)
    root = args.package.resolve()
    if not (root / "__init__.py").is_file():
        parser.error(f"{root} is not a package directory (no __init__.py)")
    order: list[str] | None = None
    if not args.import_time:
        doc = args.doc or root.parent / "docs" / "architecture.md"
        if not doc.is_file():
            parser.error(f"no package order: {doc} does not exist (give --doc, or --import-time)")
        order = read_order(doc)
        if not order:
            parser.error(f"no package order: {doc} has no numbered list under {ORDER_HEADING!r}")
    findings = check(root, order, import_time_only=args.import_time)
    counted = "import-time imports" if args.import_time else "imports (lazy and type-only too)"
    if not findings:
        ordered = "" if order is None else f", all pointing down the {len(order)}-unit package order"
        print(f"no module or package cycles among the {len(module_names(root))} modules of {root.name}: "
              f"{counted}{ordered}")
        return 0
    print("\n".join(findings))
    problems = sum(1 for line in findings if not line.startswith(" "))
    print(f"{problems} problem(s) in {root.name}, counting {counted}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
