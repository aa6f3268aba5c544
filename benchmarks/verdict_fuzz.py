"""The full verdict fuzz: every run shape of tests/support/verdict_fuzz.py (CI runs a seeded sample), each a
real pytest run against real refserver processes, checked against the verdict invariants.

    python benchmarks/verdict_fuzz.py                 # every shape, seed = today
    python benchmarks/verdict_fuzz.py --seed 7 x keyword worker-sigkill
    python benchmarks/verdict_fuzz.py --table         # the table for docs/gating.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from support.verdict_fuzz import BY_NAME, SHAPES, docs_table, run_shape


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*", help="shape names (default: all)")
    parser.add_argument("--seed", type=int, default=int(time.strftime("%Y%m%d")))
    parser.add_argument("--table", action="store_true", help="print the docs table and exit")
    args = parser.parse_args()
    if args.table:
        print(docs_table(), end="")
        return 0
    shapes = [BY_NAME[name] for name in args.shapes] if args.shapes else SHAPES
    failed = 0
    for shape in shapes:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{shape.name}-") as tmp:
            problems = run_shape(shape, Path(tmp), args.seed)
        took = time.monotonic() - started
        print(f"{'ok  ' if not problems else 'FAIL'} {shape.name:24} {took:6.1f}s", flush=True)
        for problem in problems:
            print("     " + problem.replace("\n", "\n     "))
        failed += bool(problems)
    print(f"{len(shapes) - failed} of {len(shapes)} shapes held every invariant (seed {args.seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
