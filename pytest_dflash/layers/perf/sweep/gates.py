"""Gates on a sweep's curve, each judged on confidence bounds with the perf layer's outcomes (pass / fail /
inconclusive), from [floors.SERVICE]:

* ``max_concurrency_within_slo = N``: every level up to the first level >= N meets its SLOs (so the highest
  level within the SLOs, all lower ones passing too, is >= N);
* ``goodput_at = {16 = 5.0}``: requests/s within the SLOs at that level, lower bound >= the floor;
* ``crossover_vs = "none"`` + ``speedup_up_to = N`` (+ ``min_speedup``, default 1): the service's output tok/s
  over its twin's at every level up to the first level >= N, lower bound >= min_speedup; the first level whose
  upper bound falls below 1x is stated as the crossover.

A level a gate needs and the sweep did not measure (budget spent, early stop, a sweep that stops below N)
makes the gate inconclusive, never a pass. Nothing here imports pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_dflash.layers.perf.stats import metric_sample
from pytest_dflash.layers.perf.sweep.build import goodput_sample, per_request_slo, speedup_curve
from pytest_dflash.layers.perf.sweep.run import SweepRecord
from pytest_dflash.layers.perf.verdicts import judge_floor, judge_ratio
from pytest_dflash.load.curve import GateResult, SpeedupCurve

__all__ = ["gate_crossover", "gate_goodput", "gate_max_concurrency", "judge_gates", "levels_up_to"]


def levels_up_to(levels: Sequence[int], n: int) -> tuple[list[int], int | None]:
    """The levels a gate "up to N" judges: every level up to the first one >= N (a pass there covers N), and
    that level; (all levels, None) when the sweep stops below N."""
    target = next((lvl for lvl in sorted(levels) if lvl >= n), None)
    return [lvl for lvl in sorted(levels) if target is None or lvl <= target], target


def _also(undecided: Sequence[tuple[int, str]]) -> str:
    """'; also undecided: concurrency 16 (not run: sweep_budget 2m spent)' for the levels after the first."""
    rest = [f"concurrency {level} ({why if len(why) < 80 else why[:77] + '...'})"
            for level, why in undecided[1:]]
    return f"; also undecided: {', '.join(rest)}" if rest else ""


def _short(levels: Sequence[int], n: int, key: str) -> str:
    return (f"the sweep stops at concurrency {max(levels)}, below {key} {n}: add a level >= {n} "
            "([perf] sweep or --perf-sweep)")


def gate_max_concurrency(record: SweepRecord, service: str, n: int) -> GateResult:
    """`max_concurrency_within_slo` >= n."""
    key = "max_concurrency_within_slo"
    curve = record.curve.service(service)
    if curve is None or not curve.slo:
        return GateResult(service=service, key=key, outcome="inconclusive", threshold=float(n),
                          message=f"{key}: INCONCLUSIVE — {service} has no SLOs to judge its levels by "
                                  "([slo])")
    highest = None
    for point in curve.levels:
        if point.slo_outcome != "pass":
            break
        highest = point.concurrency
    within = f"the highest level within the SLOs is {highest if highest is not None else 'none'}"
    judged, target = levels_up_to(record.curve.levels, n)
    undecided: list[tuple[int, str]] = []
    for level in judged:
        found = curve.at(level)
        if found is None or not found.measured:
            undecided.append((level, found.why if found is not None and found.why else "not measured"))
        elif found.slo_outcome == "fail":
            check = next(c for c in found.slo_checks if c.outcome == "fail")
            return GateResult(service=service, key=key, outcome="fail", level=level, threshold=float(n),
                              bound=check.lower,
                              message=f"{key}: FAIL — concurrency {level} breaks its SLOs ({check.message}); "
                                      f"{within} < {n}")
        elif found.slo_outcome != "pass":
            other = next((c for c in found.slo_checks if c.outcome != "pass"), None)
            undecided.append((level, other.message if other is not None else str(found.slo_outcome)))
    if undecided:
        level, why = undecided[0]
        return GateResult(service=service, key=key, outcome="inconclusive", level=level, threshold=float(n),
                          message=f"{key}: INCONCLUSIVE — concurrency {level}: {why}{_also(undecided)}; "
                                  f"{within}")
    if target is None:
        return GateResult(service=service, key=key, outcome="inconclusive", threshold=float(n),
                          message=f"{key}: INCONCLUSIVE — {_short(record.curve.levels, n, key)}; {within}")
    return GateResult(service=service, key=key, outcome="pass", level=target, threshold=float(n),
                      message=f"{key}: pass — every level up to concurrency {target} meets its SLOs; "
                              f"{within} >= {n}")


def gate_goodput(record: SweepRecord, service: str, level: int, floor: float, *,
                 confidence: float = 0.95) -> GateResult:
    """`goodput_at = {level = floor}`: requests/s within the SLOs at `level`, on its lower bound."""
    key = f"goodput_at.{level}"
    curve = record.curve.service(service)
    point = curve.at(level) if curve is not None else None
    result = record.results.get((service, level))

    def undecided(why: str) -> GateResult:
        return GateResult(service=service, key=key, outcome="inconclusive", level=level, threshold=floor,
                          message=f"{key}: INCONCLUSIVE — {why}")

    if point is None:
        levels = ", ".join(map(str, record.curve.levels))
        return undecided(f"concurrency {level} is not a level of this sweep ({levels})")
    if result is None or curve is None:
        return undecided(f"concurrency {level} {point.why or 'was not measured'}")
    if result.client_saturated:
        return undecided(f"the load client was saturated at concurrency {level}")
    try:
        sample = goodput_sample(result, per_request_slo(curve.slo), tokens=False)
    except ValueError as exc:
        return undecided(str(exc))
    verdict = judge_floor(f"{key} (requests/s within the SLOs at concurrency {level})", sample, floor,
                          confidence=confidence)
    fraction = point.goodput_fraction
    share = f"; {fraction:.0%} of its requests within the SLOs" if fraction is not None else ""
    return GateResult(service=service, key=key, outcome=verdict.outcome, level=level, threshold=floor,
                      bound=verdict.bound, message=verdict.message + share)


def _speedups(record: SweepRecord, service: str, versus: str, confidence: float) -> SpeedupCurve:
    found = record.curve.speedup(service, versus)
    if found is not None:
        return found
    levels = record.curve.levels
    a, b = record.curve.service(service), record.curve.service(versus)
    return speedup_curve(service, a.algorithm if a else "?", versus, b.algorithm if b else "?", levels,
                         {lvl: record.results.get((service, lvl)) for lvl in levels},
                         {lvl: record.results.get((versus, lvl)) for lvl in levels}, confidence=confidence)


def gate_crossover(record: SweepRecord, service: str, versus: str, up_to: int, *, min_speedup: float = 1.0,
                   confidence: float = 0.95) -> GateResult:
    """`crossover_vs` / `speedup_up_to` / `min_speedup`: not slower than the twin (by min_speedup) up to a
    level."""
    key = f"crossover_vs_{versus}"
    curve = _speedups(record, service, versus, confidence)
    crossing = f"the crossover: {curve.crossover_text}" if curve.crossover_text else (
        f"no crossover within the sweep (concurrency {', '.join(map(str, record.curve.levels))})")
    judged, target = levels_up_to(record.curve.levels, up_to)
    undecided: list[tuple[int, str]] = []
    lowest: tuple[float, int] | None = None
    for level in judged:
        a, b = record.results.get((service, level)), record.results.get((versus, level))
        point = curve.at(level)
        if a is None or b is None or a.client_saturated or b.client_saturated:
            undecided.append((level, point.why if point is not None and point.why else "not measured"))
            continue
        try:
            verdict = judge_ratio(f"speed-up {service}/{versus} at concurrency {level}",
                                  metric_sample(a, "output_tok_s"), metric_sample(b, "output_tok_s"),
                                  min_speedup, confidence=confidence)
        except ValueError as exc:
            undecided.append((level, str(exc)))
            continue
        if verdict.outcome == "fail":
            return GateResult(service=service, key=key, outcome="fail", level=level, threshold=min_speedup,
                              bound=verdict.upper,
                              message=f"{key}: FAIL at concurrency {level} — {verdict.point:.2f}x, "
                                      f"{confidence:.0%} upper bound {verdict.upper:.2f}x < min_speedup "
                                      f"{min_speedup:g}x (asked up to concurrency {up_to}; n={verdict.n} "
                                      f"requests); {crossing}")
        if verdict.outcome != "pass":
            undecided.append((level, verdict.message))
        elif lowest is None or verdict.lower < lowest[0]:
            lowest = (verdict.lower, level)
    if undecided:
        level, why = undecided[0]
        return GateResult(service=service, key=key, outcome="inconclusive", level=level,
                          threshold=min_speedup,
                          message=f"{key}: INCONCLUSIVE at concurrency {level} — {why}{_also(undecided)}; "
                                  f"{crossing}")
    if target is None:
        return GateResult(service=service, key=key, outcome="inconclusive", threshold=min_speedup,
                          message=f"{key}: INCONCLUSIVE — "
                                  f"{_short(record.curve.levels, up_to, 'speedup_up_to')}; {crossing}")
    low = (f" (lowest {confidence:.0%} lower bound {lowest[0]:.2f}x at concurrency {lowest[1]})" if lowest
           else "")
    return GateResult(service=service, key=key, outcome="pass", level=target, threshold=min_speedup,
                      bound=lowest[0] if lowest else None,
                      message=f"{key}: pass — {service} is at least {min_speedup:g}x {versus} at every level "
                              f"up to concurrency {target}{low}; {crossing}")


def judge_gates(record: SweepRecord, service: str, floors: Mapping[str, float | str], *,
                confidence: float = 0.95) -> dict[str, list[GateResult]]:
    """Every sweep gate of the service's floors, by test: "slo" (max_concurrency_within_slo), "goodput"
    (goodput_at.*), "crossover"."""
    out: dict[str, list[GateResult]] = {"slo": [], "goodput": [], "crossover": []}
    n = floors.get("max_concurrency_within_slo")
    if isinstance(n, int | float):
        out["slo"].append(gate_max_concurrency(record, service, int(n)))
    for key, value in floors.items():
        if key.startswith("goodput_at.") and isinstance(value, int | float):
            out["goodput"].append(gate_goodput(record, service, int(key.split(".", 1)[1]), float(value),
                                               confidence=confidence))
    versus, up_to = floors.get("crossover_vs"), floors.get("speedup_up_to")
    if isinstance(versus, str) and isinstance(up_to, int | float):
        minimum = floors.get("min_speedup", 1.0)
        out["crossover"].append(gate_crossover(record, service, versus, int(up_to),
                                               min_speedup=float(minimum) if isinstance(minimum, int | float)
                                               else 1.0, confidence=confidence))
    return out
