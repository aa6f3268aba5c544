"""Running a host's sweep: every service at every level, interleaved (all services at level L before L+1, the
order of services alternating per level, so a drift of the machine hits the plain and the speculative services
alike), with a time budget over the whole sweep and an early stop once a level breaks its SLOs twice.

    record = run_sweep("ct200", plan, [SweepService("none", "NONE", measure_none, slo), ...])
    record.curve.to_json()     # the data model (curve.py); record.results: the LoadResults, for the gates

Nothing here imports pytest: `measure` is any callable that loads one service at one concurrency.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pytest_dflash.layers.perf.sweep.build import (
    comparison_pairs,
    judge_slo,
    level_point,
    slo_outcome,
    speedup_curve,
)
from pytest_dflash.layers.perf.sweep.plan import SweepPlan, describe_budget
from pytest_dflash.load.curve import LevelPoint, ServiceCurve, SweepCurve
from pytest_dflash.load.results import LoadResult

__all__ = ["SweepRecord", "SweepService", "run_sweep"]


@dataclass(frozen=True)
class SweepService:
    """One service to sweep: how to load it at a level, and the SLOs its levels are judged against."""

    name: str
    algorithm: str
    measure: Callable[[int], LoadResult]
    objectives: Mapping[str, float] = field(default_factory=dict)  # [slo] + [slo.SERVICE]
    unavailable: str | None = None  # why it cannot be swept (not ready): every level is then "not run"


@dataclass
class SweepRecord:
    """A sweep as run: its curve, and the load runs behind it ((service, level) -> LoadResult), for the
    gates."""

    curve: SweepCurve
    results: dict[tuple[str, int], LoadResult]


def run_sweep(host: str, plan: SweepPlan, services: Sequence[SweepService], *,
              pairs: Sequence[tuple[str, str]] | None = None, confidence: float = 0.95,
              load: Mapping[str, object] | None = None, say: Callable[[str], None] = lambda message: None,
              clock: Callable[[], float] = time.monotonic) -> SweepRecord:
    """Sweep `services` over `plan.levels`; `pairs`: the (service, twin) speed-ups to state (default: each
    speculative service over each plain one)."""
    started = clock()
    results: dict[tuple[str, int], LoadResult] = {}
    points: dict[str, dict[int, LevelPoint]] = {s.name: {} for s in services}
    stopped: dict[str, str] = {}
    why_not: dict[tuple[str, int], str] = {}
    budget_text = f"not run: sweep_budget {describe_budget(plan.budget_s)} spent" if plan.budget_s else ""

    def over_budget() -> bool:
        return plan.budget_s is not None and clock() - started >= plan.budget_s

    for index, level in enumerate(plan.levels):
        order = list(services) if index % 2 == 0 else list(reversed(services))
        for svc in order:
            why = (f"not run: {svc.unavailable}" if svc.unavailable else stopped.get(svc.name)
                   or (budget_text if over_budget() else None))
            if why is not None:
                points[svc.name][level] = LevelPoint.not_run(level, why)
                why_not[(svc.name, level)] = why
                continue
            say(f"{host}/{svc.name}: sweep at concurrency {level} "
                f"({plan.requests_at(level)} requests)")
            result = svc.measure(level)
            checks = judge_slo(result, svc.objectives, confidence=confidence)
            attempts = 1
            if plan.early_stop and slo_outcome(checks) == "fail" and not over_budget():
                first = next(j for j in checks if j.outcome == "fail")
                say(f"{host}/{svc.name}: concurrency {level} breaks its SLOs ({first.message}): "
                    "measuring again")
                result = svc.measure(level)
                checks = judge_slo(result, svc.objectives, confidence=confidence)
                attempts = 2
                if slo_outcome(checks) == "fail":
                    again = next(j for j in checks if j.outcome == "fail")
                    stopped[svc.name] = (f"not run: early stop — {svc.name} broke its SLOs twice at "
                                         f"concurrency {level} ({again.message})")
                    say(f"{host}/{svc.name}: {stopped[svc.name].removeprefix('not run: ')}")
            results[(svc.name, level)] = result
            points[svc.name][level] = level_point(result, svc.objectives, confidence=confidence,
                                                  attempts=attempts, judgements=checks)
    curves = tuple(ServiceCurve(service=s.name, algorithm=s.algorithm,
                                levels=tuple(points[s.name][lvl] for lvl in plan.levels),
                                slo=dict(s.objectives), stopped=stopped.get(s.name)) for s in services)
    algorithms = {s.name: s.algorithm for s in services}
    wanted = list(pairs) if pairs is not None else comparison_pairs(algorithms)
    speedups = []
    for a, b in wanted:
        if a not in algorithms or b not in algorithms:
            continue
        reasons: dict[int, str] = {}
        for lvl in plan.levels:
            reason = why_not.get((a, lvl)) or why_not.get((b, lvl))
            if reason:
                reasons[lvl] = reason
        speedups.append(speedup_curve(
            a, algorithms[a], b, algorithms[b], plan.levels,
            {lvl: results.get((a, lvl)) for lvl in plan.levels},
            {lvl: results.get((b, lvl)) for lvl in plan.levels}, why_not=reasons, confidence=confidence))
    curve = SweepCurve(host=host, levels=plan.levels, services=curves, speedups=tuple(speedups),
                       load=dict(load or {}), slo={}, confidence=confidence, budget_s=plan.budget_s,
                       spent_s=round(clock() - started, 3), written=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return SweepRecord(curve=curve, results=results)
