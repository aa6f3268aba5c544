"""Typed verdicts on noisy performance numbers (stats.py's bounds): ``pass`` when the bound on the good side
clears the threshold, ``fail`` only when the bound on the bad side is past it (a *confident* failure),
``inconclusive`` otherwise, with how many more requests would likely decide; a floor, a regression against a
baseline, a speed-up ratio."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from pytest_dflash.layers.perf.stats import (
    DEFAULT_MIN_N,
    DEFAULT_N_BOOT,
    Bound,
    Outcome,
    Sample,
    bootstrap_bound,
    point_of,
    ratio_bound,
)

__all__ = ["Verdict", "judge_bound", "judge_floor", "judge_ratio", "judge_regression"]

# ------------------------------------------------------------------------------------------------
# Verdicts
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The outcome of judging one floor (or ceiling), with the evidence.

    ``bound`` is the bound that matters for the outcome: on a pass the bound on the good side, on a
    fail the bound on the bad side; when inconclusive, the good-side bound (the one that fell short).
    """

    name: str
    outcome: Outcome
    point: float
    bound: float
    lower: float
    upper: float
    threshold: float
    higher_is_better: bool
    confidence: float
    n: int
    units: int
    more_requests: int | None  # inconclusive: about how many more requests would decide
    unit: str = ""
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def failed(self) -> bool:
        return self.outcome == "fail"

    def __str__(self) -> str:
        return self.message


def _g(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def _more_requests(n: int, point: float, near: float, threshold: float) -> int | None:
    """Requests to add so that the bound at ``near`` clears ``threshold`` (half-width ~ 1/sqrt(n))."""
    half = abs(point - near)
    gap = abs(point - threshold)
    if gap == 0 or not math.isfinite(half) or not math.isfinite(gap):
        return None
    needed = math.ceil(n * (half / gap) ** 2)
    return max(needed - n, 1)


def judge_bound(name: str, b: Bound, threshold: float, *, higher_is_better: bool = True,
                min_n: int = DEFAULT_MIN_N) -> Verdict:
    """Pass / fail / inconclusive from a :class:`Bound` (see the module docstring)."""
    pct = f"{b.confidence:.0%}"
    unit = f" {b.unit}" if b.unit and b.unit != "x" else ("x" if b.unit == "x" else "")
    cmp_word = "floor" if higher_is_better else "ceiling"
    good_bound = b.lower if higher_is_better else b.upper
    bad_bound = b.upper if higher_is_better else b.lower
    good_ok = good_bound >= threshold if higher_is_better else good_bound <= threshold
    bad_past = bad_bound < threshold if higher_is_better else bad_bound > threshold
    good_name = "lower" if higher_is_better else "upper"
    bad_name = "upper" if higher_is_better else "lower"
    point_ok = b.point >= threshold if higher_is_better else b.point <= threshold
    sizes = f"n={b.n} requests" + (f" in {b.units} blocks" if b.units != b.n else "")

    def verdict(outcome: Outcome, bound: float, more: int | None, msg: str) -> Verdict:
        return Verdict(name=name, outcome=outcome, point=b.point, bound=bound, lower=b.lower, upper=b.upper,
                       threshold=threshold, higher_is_better=higher_is_better, confidence=b.confidence, n=b.n,
                       units=b.units, more_requests=more, unit=b.unit, message=msg)

    if b.units < min_n:
        more = max(math.ceil(min_n * b.n / max(b.units, 1)) - b.n, 1)
        msg = (f"{name}: INCONCLUSIVE — {_g(b.point)}{unit} from too short a run ({sizes}; at least "
               f"{min_n} units are needed to judge); about {more} more requests would decide")
        return verdict("inconclusive", good_bound, more, msg)
    if not math.isfinite(good_bound) and not bad_past:
        more = max(b.min_n - b.n, 1)
        msg = (f"{name}: INCONCLUSIVE — {_g(b.point)}{unit} ({sizes}): the {b.statistic} of {b.n} requests "
               f"cannot be bounded {'below' if higher_is_better else 'above'} at {pct}; at least "
               f"{b.min_n} requests are needed (about {more} more)")
        return verdict("inconclusive", good_bound, more, msg)
    if good_ok:
        msg = (f"{name}: pass — {_g(b.point)}{unit}, {pct} {good_name} bound {_g(good_bound)}{unit} "
               f"{'>=' if higher_is_better else '<='} {cmp_word} {_g(threshold)}{unit} ({sizes})")
        return verdict("pass", good_bound, None, msg)
    if bad_past:
        msg = (f"{name}: FAIL — {_g(b.point)}{unit}, {pct} {bad_name} bound {_g(bad_bound)}{unit} "
               f"{'<' if higher_is_better else '>'} {cmp_word} {_g(threshold)}{unit} ({sizes})")
        return verdict("fail", bad_bound, None, msg)
    near = good_bound if point_ok else bad_bound
    more_n = _more_requests(b.n, b.point, near, threshold)
    hint = (f"about {more_n} more requests would likely decide" if more_n is not None
            else "the estimate sits on the threshold: more requests may never decide")
    msg = (f"{name}: INCONCLUSIVE — {_g(b.point)}{unit}, {pct} bounds [{_g(b.lower)}, {_g(b.upper)}]{unit} "
           f"straddle the {cmp_word} {_g(threshold)}{unit} ({sizes}); {hint}")
    return verdict("inconclusive", good_bound, more_n, msg)


def judge_floor(name: str, sample: Sample, threshold: float, *, higher_is_better: bool = True,
                confidence: float = 0.95, n_boot: int = DEFAULT_N_BOOT, seed: int = 0,
                min_n: int = DEFAULT_MIN_N) -> Verdict:
    """Judge ``sample``'s statistic against a floor (``higher_is_better``) or a ceiling."""
    b = bootstrap_bound(sample, confidence=confidence, n_boot=n_boot, seed=seed)
    return judge_bound(name, b, threshold, higher_is_better=higher_is_better, min_n=min_n)


def judge_regression(name: str, current: Sample, baseline: Sample | float, *, max_regression_pct: float,
                     higher_is_better: bool = True, confidence: float = 0.95, n_boot: int = DEFAULT_N_BOOT,
                     seed: int = 0, min_n: int = DEFAULT_MIN_N) -> Verdict:
    """Fail only when confidently worse than the baseline by more than ``max_regression_pct``.

    Judged on the ratio current / baseline: a floor of ``1 - pct/100`` when higher is better
    (throughput), a ceiling of ``1 + pct/100`` when lower is better (latency).
    """
    b = ratio_bound(current, baseline, confidence=confidence, n_boot=n_boot, seed=seed)
    limit = 1.0 - max_regression_pct / 100.0 if higher_is_better else 1.0 + max_regression_pct / 100.0
    v = judge_bound(name, b, limit, higher_is_better=higher_is_better, min_n=min_n)
    base_point = baseline if not isinstance(baseline, Sample) else point_of(baseline)
    detail = (f" [current {_g(point_of(current))}{' ' + current.unit if current.unit else ''} vs baseline "
              f"{_g(float(base_point))}; allowed regression {max_regression_pct:g}%]")
    return dataclasses.replace(v, message=v.message + detail)


def judge_ratio(name: str, a: Sample, b: Sample, floor: float, *, confidence: float = 0.95,
                n_boot: int = DEFAULT_N_BOOT, seed: int = 0, min_n: int = DEFAULT_MIN_N) -> Verdict:
    """Judge ``stat(a) / stat(b)`` (e.g. a speed-up) against a floor."""
    bound = ratio_bound(a, b, confidence=confidence, n_boot=n_boot, seed=seed)
    v = judge_bound(name, bound, floor, higher_is_better=True, min_n=min_n)
    detail = f" [{_g(point_of(a))} vs {_g(point_of(b))}{' ' + a.unit if a.unit else ''}]"
    return dataclasses.replace(v, message=v.message + detail)
