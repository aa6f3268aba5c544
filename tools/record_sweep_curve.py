"""Write tests/data/refserver-sweep-curve/sweep.json: the refserver sweep (tests/data/refserver-sweep) as the
perf layer writes a host's curve, with SLOs that some levels break and a level 16 the budget left unrun.

    python tools/record_sweep_curve.py
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pytest_dflash.layers.perf.sweep.build import curve_from_runs
from pytest_dflash.load.curve import LevelPoint, SpeedupPoint
from pytest_dflash.load.results import LoadResult

ROOT = Path(__file__).parents[1] / "tests" / "data"
BUDGET = "not run: sweep_budget 2m spent"


def main() -> None:
    runs: dict[str, dict[int, LoadResult]] = {}
    for path in sorted((ROOT / "refserver-sweep").glob("*.json")):
        result = LoadResult.from_json(path.read_text())
        runs.setdefault(path.stem.split("-")[0], {})[int(result.spec.concurrency or 1)] = result
    curve = curve_from_runs(runs, host="refserver", algorithms={"none": "NONE", "dflash": "DFLASH"},
                            slo={"ttft_p99_ms": 100.0, "tpot_p99_ms": 10.0}, levels=[1, 4, 8, 16])
    services = tuple(dataclasses.replace(s, levels=tuple(
        LevelPoint.not_run(p.concurrency, BUDGET) if not p.measured else p for p in s.levels))
        for s in curve.services)
    speedups = tuple(dataclasses.replace(s, points=tuple(
        SpeedupPoint(concurrency=p.concurrency, why=BUDGET) if p.ratio is None else p for p in s.points))
        for s in curve.speedups)
    curve = dataclasses.replace(curve, services=services, speedups=speedups, budget_s=120.0, spent_s=120.4,
                                written="2026-12-06T13:00:00+0000")
    (ROOT / "refserver-sweep-curve" / "sweep.json").write_text(curve.to_json())


if __name__ == "__main__":
    main()
