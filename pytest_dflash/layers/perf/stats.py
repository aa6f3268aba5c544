"""Judging performance floors on noisy data: bootstrap confidence bounds and typed verdicts.

A deploy gate that flakes gets switched off, so a floor is never judged on a point estimate:

* :func:`bootstrap_bound` resamples the *requests* of a run (seeded, vectorised) and returns the
  point estimate with one-sided lower and upper confidence bounds at ``confidence`` each.
* :func:`judge_floor` turns a bound into a :class:`Verdict`: ``pass`` when the bound on the good
  side clears the threshold, ``fail`` only when the bound on the bad side is past it (a *confident*
  failure), ``inconclusive`` otherwise — with how many more requests would likely decide. A run
  with fewer than ``min_n`` resampling units is inconclusive whatever its spread.
* :func:`judge_regression` compares a run with a saved baseline (ratio of the two statistics,
  both resampled), :func:`judge_ratio` judges a speed-up between two services (e.g. DDTREE vs
  DFLASH output tok/s) against a floor.

What is resampled
-----------------
The unit of resampling is the **request**: requests are the independent-ish repetitions of a run.
With ``block > 1`` it is a block of ``block`` consecutive requests (circular block bootstrap), which
keeps requests that ran side by side in one batch together; use ``block = concurrency`` for
throughput, whose requests share the server's batches.

* latency statistics (``mean``, ``p50``, ``p99`` …) resample per-request values;
* pooled statistics over events (e.g. ITL p99: every inter-token gap of every request) resample
  requests and weight each request's gaps by how often it was drawn (a cluster bootstrap: gaps of
  one request are not independent of each other);
* **throughput** (output tok/s) is a ratio estimator: it resamples the pairs (output tokens, e2e
  seconds) of requests and computes ``L · Σ tokens / Σ e2e``, where ``L = Σ e2e / duration`` is the
  mean number of requests in flight — the load the client imposed, held fixed. The point estimate
  is exactly ``total_output_tokens / duration`` (bench_serving's ``output_throughput``), and the
  interval reflects how much the *speed* of requests varied. (Resampling token counts with the
  duration fixed would give a zero-width interval whenever output lengths are fixed.)

Bounds by statistic: percentiles of one value per request get exact, distribution-free
order-statistic bounds (a p99 of fewer than 299 requests has no finite 95 % upper bound: a ceiling
on it is inconclusive, while a clearly slow service still fails); means get the bootstrap-t;
ratios, pooled and blocked statistics the percentile bootstrap with Hesterberg's small-sample
widening (z scaled by ``sqrt(n / (n - 1))``). Measured false-fail rates with the truth exactly at
the threshold are in docs/perf.md (2–7 %, nominal 5 %). Resampled requests are assumed
exchangeable: a run that drifts (a GPU that heats up) is better served by blocks.

The verdicts on these bounds (pass / fail / inconclusive, :func:`judge_floor` …) are in verdicts.py; the
judging of a perf run on them lives in judging.py and baseline.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from pytest_dflash.load.results import LoadResult

__all__ = ["DEFAULT_MIN_N", "DEFAULT_N_BOOT", "Bound", "Outcome", "Sample", "bootstrap_bound",
           "metric_sample", "point_of", "ratio_bound"]

Outcome = Literal["pass", "fail", "inconclusive"]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
_PCT = re.compile(r"^p(\d+(?:\.\d+)?)$")
DEFAULT_N_BOOT = 4000
DEFAULT_MIN_N = 20


# ------------------------------------------------------------------------------------------------
# Samples
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Sample:
    """Per-request data behind one statistic, and how to resample it.

    ``statistic``: ``"mean"``, ``"median"``, ``"pNN"`` (percentile, e.g. ``"p99"``, ``"p99.9"``) or
    ``"ratio"`` (``scale · Σ values / Σ denominators``). With ``groups`` set, ``values`` are pooled
    events and ``groups[i]`` is the request index of event ``i`` (cluster bootstrap).
    """

    statistic: str
    values: FloatArray
    denominators: FloatArray | None = None
    groups: IntArray | None = None
    scale: float = 1.0
    block: int = 1
    unit: str = ""

    def __post_init__(self) -> None:
        if self.statistic not in ("mean", "median", "ratio") and not _PCT.match(self.statistic):
            raise ValueError(f"Sample.statistic: {self.statistic!r} is not mean/median/ratio/pNN")
        if self.statistic == "ratio" and (self.denominators is None
                                          or len(self.denominators) != len(self.values)):
            raise ValueError("Sample(statistic='ratio') needs denominators of the same length as values")
        if self.groups is not None:
            if len(self.groups) != len(self.values):
                raise ValueError("Sample.groups must have one request index per value")
            if self.statistic == "ratio":
                raise ValueError("Sample.groups works with mean/median/pNN, not ratio")
            if self.block != 1:
                raise ValueError("Sample.groups (cluster bootstrap) works with block=1 only")
        if self.block < 1:
            raise ValueError(f"Sample.block must be >= 1, got {self.block}")

    @property
    def n(self) -> int:
        """Number of requests (the resampling units before blocking)."""
        if self.groups is not None:
            return int(self.groups.max()) + 1 if len(self.groups) else 0
        return len(self.values)

    @property
    def units(self) -> int:
        """Number of independent resampling units (requests, or blocks of requests)."""
        return math.ceil(self.n / self.block) if self.n else 0

    @classmethod
    def of(cls, values: npt.ArrayLike, statistic: str = "mean", *, block: int = 1, unit: str = "") -> Sample:
        """One value per request (e.g. TTFT in ms)."""
        return cls(statistic, np.asarray(values, dtype=np.float64).ravel(), block=block, unit=unit)

    @classmethod
    def pooled(cls, per_request: Sequence[Sequence[float]], statistic: str = "p99", *,
               unit: str = "") -> Sample:
        """Events pooled over requests (e.g. every ITL), resampled by request."""
        vals = np.asarray([v for r in per_request for v in r], dtype=np.float64)
        groups = np.asarray([i for i, r in enumerate(per_request) for _ in r], dtype=np.int64)
        return cls(statistic, vals, groups=groups, unit=unit)

    @classmethod
    def throughput(cls, tokens: npt.ArrayLike, e2e_s: npt.ArrayLike, duration_s: float, *,
                   block: int = 1, unit: str = "tok/s") -> Sample:
        """Output tok/s as ``L · Σ tokens / Σ e2e`` with ``L = Σ e2e / duration`` held fixed."""
        tok = np.asarray(tokens, dtype=np.float64)
        e2e = np.asarray(e2e_s, dtype=np.float64)
        if duration_s <= 0 or len(tok) == 0:
            raise ValueError("Sample.throughput needs a positive duration and at least one request")
        load = float(e2e.sum()) / duration_s
        return cls("ratio", tok, denominators=e2e, scale=load, block=block, unit=unit)


# ------------------------------------------------------------------------------------------------
# Bootstrap
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Bound:
    """A point estimate with one-sided lower and upper bounds, each at ``confidence``."""

    statistic: str
    point: float
    lower: float
    upper: float
    confidence: float
    n: int  # requests
    units: int  # resampling units (requests or blocks)
    n_boot: int
    unit: str = ""
    method: str = "bootstrap"  # or "order-statistic" (exact, distribution-free)
    min_n: int = 0  # fewest requests for which both bounds can be finite (order statistics)


def _indices(n: int, n_boot: int, block: int, rng: np.random.Generator) -> IntArray:
    """(n_boot, n) resampled request indices; circular blocks of ``block`` consecutive requests."""
    if block <= 1:
        return rng.integers(0, n, size=(n_boot, n), dtype=np.int64)
    k = math.ceil(n / block)
    starts = rng.integers(0, n, size=(n_boot, k), dtype=np.int64)
    idx = (starts[:, :, None] + np.arange(block, dtype=np.int64)) % n
    return idx.reshape(n_boot, k * block)[:, :n]


def _q(statistic: str) -> float:
    if statistic == "median":
        return 50.0
    m = _PCT.match(statistic)
    assert m is not None
    return float(m.group(1))


def _point(s: Sample) -> float:
    if s.statistic == "ratio":
        assert s.denominators is not None
        return float(s.scale * s.values.sum() / s.denominators.sum())
    if s.statistic == "mean":
        return float(s.values.mean())
    return float(np.percentile(s.values, _q(s.statistic)))


def _replicates(s: Sample, n_boot: int, rng: np.random.Generator) -> FloatArray:
    """The statistic on ``n_boot`` bootstrap resamples, vectorised."""
    if s.groups is not None:
        return _pooled_replicates(s, n_boot, rng)
    idx = _indices(len(s.values), n_boot, s.block, rng)
    vals = s.values[idx]
    if s.statistic == "ratio":
        assert s.denominators is not None
        den = s.denominators[idx].sum(axis=1)
        out: FloatArray = s.scale * vals.sum(axis=1) / np.where(den > 0, den, np.nan)
        return out
    if s.statistic == "mean":
        means: FloatArray = vals.mean(axis=1)
        return means
    pcts: FloatArray = np.percentile(vals, _q(s.statistic), axis=1)
    return pcts


def _pooled_replicates(s: Sample, n_boot: int, rng: np.random.Generator) -> FloatArray:
    """Cluster bootstrap of a pooled statistic: requests drawn with replacement, events weighted."""
    assert s.groups is not None
    n = s.n
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)  # (B, n)
    if s.statistic == "mean":
        sums = np.bincount(s.groups, weights=s.values, minlength=n)
        lens = np.bincount(s.groups, minlength=n).astype(np.float64)
        out: FloatArray = (counts @ sums) / np.maximum(counts @ lens, 1e-300)
        return out
    q = _q(s.statistic) / 100.0
    order = np.argsort(s.values, kind="stable")
    sorted_vals = s.values[order]
    m = len(sorted_vals)
    grid_n = min(m, 2048)
    ranks = np.unique(np.linspace(0, m - 1, grid_n).round().astype(np.int64))
    grid = sorted_vals[ranks]
    # K[j, g] = events of request j with value <= grid[g]
    g = len(grid)
    k = np.zeros((n, g + 1), dtype=np.float64)
    pos = np.searchsorted(grid, s.values, side="left")  # first grid point >= value (g: none)
    np.add.at(k, (s.groups, pos), 1.0)
    k = np.cumsum(k[:, :g], axis=1)
    lens = np.bincount(s.groups, minlength=n).astype(np.float64)
    cum = counts @ k  # (B, G): weighted events <= grid[g]
    total = counts @ lens
    first = (cum >= q * total[:, None]).argmax(axis=1)
    replicates: FloatArray = grid[first]
    return replicates


def _level(confidence: float, n: int) -> float:
    """Hesterberg's expanded percentile level for a one-sided bound at ``confidence``."""
    if n < 2:
        return confidence
    z = NormalDist().inv_cdf(confidence) * math.sqrt(n / (n - 1))
    return NormalDist().cdf(z)


def _order_stat_bounds(values: FloatArray, q: float, confidence: float) -> tuple[float, float, int]:
    """Exact distribution-free bounds of the q-quantile (0 < q < 1) from order statistics.

    ``P(X_(k) <= xi_q) = P(Binom(n, q) >= k)``: the lower bound is the largest order statistic with
    that probability >= confidence, the upper bound the smallest ``X_(j)`` with
    ``P(Binom(n, q) <= j - 1) >= confidence``; ``-inf``/``inf`` when n is too small for one.
    Also returns the fewest n for which both exist.
    """
    x = np.sort(values)
    n = len(x)
    k = np.arange(n, dtype=np.float64)
    log_ratio = np.log((n - k) / (k + 1)) + math.log(q) - math.log1p(-q)
    logpmf = np.concatenate(([n * math.log1p(-q)], n * math.log1p(-q) + np.cumsum(log_ratio)))
    pmf = np.exp(logpmf - logpmf.max())
    cdf = np.cumsum(pmf) / pmf.sum()  # cdf[k] = P(B <= k), k = 0..n
    at_least = 1.0 - np.concatenate(([0.0], cdf[:-1]))  # at_least[k] = P(B >= k)
    ks = np.nonzero(at_least[1:] >= confidence)[0]  # candidates k = 1..n (index k-1)
    lower = float(x[ks[-1]]) if len(ks) else -math.inf
    js = np.nonzero(cdf[:n] >= confidence)[0]  # j - 1 = 0..n-1
    upper = float(x[js[0]]) if len(js) else math.inf
    need_hi = math.ceil(math.log(1 - confidence) / math.log(q))  # 1 - q^n >= c
    need_lo = math.ceil(math.log(1 - confidence) / math.log1p(-q))  # 1 - (1-q)^n >= c
    return lower, upper, max(need_hi, need_lo)


def _bootstrap_t_mean(sample: Sample, confidence: float, n_boot: int, rng: np.random.Generator) -> Bound:
    """Studentized (bootstrap-t) bounds of a mean: calibrated on skewed data where percentiles are not."""
    x = sample.values
    n = len(x)
    mean = float(x.mean())
    se = float(x.std(ddof=1)) / math.sqrt(n)
    lo = hi = mean
    if se > 0:
        vals = x[_indices(n, n_boot, 1, rng)]
        se_b = vals.std(axis=1, ddof=1) / math.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (vals.mean(axis=1) - mean) / se_b
        t = t[np.isfinite(t)]
        if len(t):
            t_hi, t_lo = (float(v) for v in np.quantile(t, [confidence, 1.0 - confidence]))
            lo, hi = mean - t_hi * se, mean - t_lo * se
    return Bound(statistic="mean", point=mean, lower=lo, upper=hi, confidence=confidence, n=n, units=n,
                 n_boot=n_boot, unit=sample.unit, method="bootstrap-t")


def bootstrap_bound(sample: Sample, *, confidence: float = 0.95, n_boot: int = DEFAULT_N_BOOT,
                    seed: int = 0) -> Bound:
    """Point estimate and one-sided bounds (each at ``confidence``) of ``sample.statistic``.

    Percentiles of one value per request (``block=1``) get exact order-statistic bounds instead of
    bootstrap ones: the percentile bootstrap under-covers high quantiles of skewed latencies (its
    upper bound cannot exceed the sample maximum). Means of one value per request get
    bootstrap-t (studentized) bounds, which stay calibrated on skewed data.
    """
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    if sample.n == 0:
        raise ValueError("bootstrap_bound: empty sample")
    if sample.statistic not in ("mean", "ratio") and sample.groups is None and sample.block == 1:
        q = _q(sample.statistic) / 100.0
        if 0.0 < q < 1.0:
            lo, hi, need = _order_stat_bounds(sample.values, q, confidence)
            return Bound(statistic=sample.statistic, point=_point(sample), lower=lo, upper=hi,
                         confidence=confidence, n=sample.n, units=sample.units, n_boot=0, unit=sample.unit,
                         method="order-statistic", min_n=need)
    rng = np.random.default_rng(seed)
    if sample.statistic == "mean" and sample.groups is None and sample.block == 1 and sample.n >= 3:
        return _bootstrap_t_mean(sample, confidence, n_boot, rng)
    reps = _replicates(sample, n_boot, rng)
    reps = reps[np.isfinite(reps)]
    level = _level(confidence, sample.units)
    lo, hi = (float(x) for x in np.quantile(reps, [1.0 - level, level]))
    return Bound(statistic=sample.statistic, point=_point(sample), lower=lo, upper=hi, confidence=confidence,
                 n=sample.n, units=sample.units, n_boot=n_boot, unit=sample.unit)


def ratio_bound(a: Sample, b: Sample | float, *, confidence: float = 0.95, n_boot: int = DEFAULT_N_BOOT,
                seed: int = 0) -> Bound:
    """Bounds of ``stat(a) / stat(b)``, each sample resampled independently.

    ``b`` may be a plain number (a baseline kept only as a summary): it is then held fixed.
    """
    rng = np.random.default_rng(seed)
    ra = _replicates(a, n_boot, rng)
    if isinstance(b, Sample):
        rb = _replicates(b, n_boot, rng)
        pb = _point(b)
        units = min(a.units, b.units)
        n = min(a.n, b.n)
    else:
        rb = np.full(n_boot, float(b))
        pb = float(b)
        units, n = a.units, a.n
    if pb == 0:
        raise ValueError("ratio_bound: the denominator statistic is 0")
    reps = ra / np.where(rb != 0, rb, np.nan)
    reps = reps[np.isfinite(reps)]
    level = _level(confidence, units)
    lo, hi = (float(x) for x in np.quantile(reps, [1.0 - level, level]))
    return Bound(statistic=f"ratio of {a.statistic}", point=_point(a) / pb, lower=lo, upper=hi,
                 confidence=confidence, n=n, units=units, n_boot=n_boot, unit="x")


# ------------------------------------------------------------------------------------------------
# Samples from a load run
# ------------------------------------------------------------------------------------------------

_SERIES_RE = re.compile(r"^(ttft|itl|tpot|e2e)_(mean|median|p\d+(?:\.\d+)?)_ms$")


def metric_sample(result: LoadResult, metric: str) -> Sample:
    """The :class:`Sample` behind a floor's metric name, from the successful measured requests.

    ``output_tok_s`` / ``request_per_s`` (throughput, blocks of ``concurrency`` requests),
    ``accept_length`` (token-weighted: Σ tokens / Σ verify steps, from /generate meta_info),
    ``ttft_<stat>_ms``, ``tpot_<stat>_ms``, ``e2e_<stat>_ms`` (per request) and ``itl_<stat>_ms``
    (every gap, resampled by request), with ``<stat>`` = mean, median or pNN.
    """
    ok = result.successful
    if not ok:
        raise ValueError(f"{metric}: the run has no successful request to judge")
    if metric in ("output_tok_s", "request_per_s"):
        duration = float(result.metrics["duration"])
        block = max(1, int(result.metrics.get("max_concurrency") or 1))
        e2e = [(r.e2e_ms or 0.0) / 1000.0 for r in ok]
        if metric == "output_tok_s":
            return Sample.throughput([float(r.output_tokens or 0) for r in ok], e2e, duration, block=block)
        return Sample.throughput([1.0] * len(ok), e2e, duration, block=block, unit="req/s")
    if metric == "accept_length":
        spec = [r for r in ok if r.verify_ct]
        if not spec:
            raise ValueError("accept_length: no request carried spec_verify_ct (native /generate needed)")
        return Sample("ratio", np.asarray([float(r.output_tokens or 0) for r in spec]),
                      denominators=np.asarray([float(r.verify_ct or 0) for r in spec]), unit="tokens/step")
    m = _SERIES_RE.match(metric)
    if m is None:
        raise ValueError(f"unknown metric {metric!r} (output_tok_s, request_per_s, accept_length, "
                         "ttft_p99_ms, itl_p99_ms, tpot_mean_ms, e2e_p50_ms, …)")
    series, stat = m.group(1), m.group(2)
    if series == "itl":
        return Sample.pooled([r.itl_ms for r in ok], stat, unit="ms")
    if series == "ttft":
        vals = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    elif series == "e2e":
        vals = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    else:
        vals = [t for r in ok if (t := r.tpot_ms) is not None]
    return Sample.of([float(v) for v in vals], stat, unit="ms")


def point_of(sample: Sample) -> float:
    """The statistic of a sample as measured (no resampling)."""
    return _point(sample)
