"""The verdict fuzz (issue 24): a seeded sample of run shapes per CI run — real pytest runs of a small dflash
suite against real refserver processes — each checked against the invariants (tests/support/verdict_fuzz.py).
The full sweep is benchmarks/verdict_fuzz.py. DFLASH_FUZZ_SEED=N reproduces a CI run's sample."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support.verdict_fuzz import BY_NAME, SHAPES, sample

SEED = int(os.environ.get("DFLASH_FUZZ_SEED") or time.strftime("%Y%m%d"))  # a new sample each day, reproducible
SAMPLED = [shape.name for shape in sample(SEED, 3)]


@pytest.mark.parametrize("name", SAMPLED)
def test_verdict_invariants_hold(name: str, tmp_path: Path) -> None:
    from support.verdict_fuzz import run_shape

    problems = run_shape(BY_NAME[name], tmp_path, SEED)
    assert not problems, f"DFLASH_FUZZ_SEED={SEED}\n" + "\n".join(problems)


def test_the_docs_exit_code_table_is_the_fuzz_table() -> None:
    """docs/gating.md's "Exit codes by run shape" is generated from SHAPES (benchmarks/verdict_fuzz.py --table);
    the fuzz runs prove each row, so the docs say what the code does."""
    from support.verdict_fuzz import docs_table

    docs = (Path(__file__).parents[2] / "docs" / "gating.md").read_text()
    assert docs_table() in docs, "docs/gating.md is stale: python benchmarks/verdict_fuzz.py --table"
    assert len({s.name for s in SHAPES}) == len(SHAPES)
