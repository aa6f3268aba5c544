"""Bootstrap bounds and floor verdicts: strict on clear regressions, stable on clean noise."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from pytest_dflash.layers.perf.stats import Sample, bootstrap_bound, metric_sample, ratio_bound
from pytest_dflash.layers.perf.verdicts import judge_bound, judge_floor, judge_ratio, judge_regression
from pytest_dflash.load import LoadResult, LoadSpec, RequestRecord, Saturation, aggregate


def _run(rng: np.random.Generator, n: int, *, speed: float = 100.0, conc: int = 8,
         cv: float = 0.15) -> tuple[np.ndarray, np.ndarray, float]:
    """A closed-loop run: n requests of 128 tokens whose e2e varies (gamma), at concurrency conc.

    True throughput = conc * 128 / E[e2e] = conc * speed.
    """
    tokens = np.full(n, 128.0)
    mean_e2e = 128.0 / speed
    shape = 1.0 / cv**2
    e2e = rng.gamma(shape, mean_e2e / shape, size=n)
    duration = float(e2e.sum()) / conc  # conc requests in flight all the time
    return tokens, e2e, duration


def test_throughput_point_estimate_is_total_tokens_over_duration() -> None:
    rng = np.random.default_rng(1)
    tokens, e2e, duration = _run(rng, 200)
    s = Sample.throughput(tokens, e2e, duration, block=8)
    b = bootstrap_bound(s, seed=3)
    assert b.point == pytest.approx(tokens.sum() / duration)
    assert b.lower < b.point < b.upper
    assert b.units == 25 and b.n == 200


def test_bounds_are_reproducible_for_a_seed() -> None:
    s = Sample.of(np.random.default_rng(5).lognormal(3, 0.4, 300), "mean")
    assert bootstrap_bound(s, seed=11) == bootstrap_bound(s, seed=11)
    assert bootstrap_bound(s, seed=11).lower != bootstrap_bound(s, seed=12).lower


def test_percentile_bounds_are_exact_order_statistics() -> None:
    values = np.random.default_rng(3).lognormal(3, 0.5, 60)
    b = bootstrap_bound(Sample.of(values, "p90"))
    assert b.method == "order-statistic"
    x = np.sort(values)

    def at_least(k: int) -> float:  # P(Binom(60, 0.9) >= k)
        return sum(math.comb(60, i) * 0.9**i * 0.1 ** (60 - i) for i in range(k, 61))

    k = max(k for k in range(1, 61) if at_least(k) >= 0.95)
    j = min(j for j in range(1, 61) if 1 - at_least(j) >= 0.95)
    assert b.lower == x[k - 1] and b.upper == x[j - 1]
    assert b.lower < b.point < b.upper


def test_p99_of_too_few_requests_cannot_pass_a_ceiling() -> None:
    # 100 requests: no order statistic bounds the p99 from above at 95 % (1 - 0.99^100 < 0.95)
    v = judge_floor("ttft_p99_ms", Sample.of(np.full(100, 10.0), "p99"), 50.0, higher_is_better=False)
    assert v.outcome == "inconclusive"
    assert v.upper == math.inf
    assert v.more_requests == 299 - 100
    assert "at least 299 requests" in v.message
    # but a clearly slow service fails on the same 100 requests: its lower bound is past the ceiling
    assert judge_floor("ttft_p99_ms", Sample.of(np.full(100, 90.0), "p99"), 50.0, higher_is_better=False).failed


def test_clear_regression_fails_with_the_evidence_in_the_message() -> None:
    rng = np.random.default_rng(2)
    tokens, e2e, duration = _run(rng, 200, speed=80.0)  # true 640 tok/s
    v = judge_floor("output_tok_s", Sample.throughput(tokens, e2e, duration, block=8), 800.0)
    assert v.outcome == "fail" and v.failed
    assert v.bound < 800.0 and v.bound == v.upper
    assert "FAIL" in v.message and "800" in v.message and f"{v.point:.4g}" in v.message
    assert v.more_requests is None


def test_clear_pass() -> None:
    rng = np.random.default_rng(3)
    tokens, e2e, duration = _run(rng, 200, speed=100.0)  # true 800 tok/s
    v = judge_floor("output_tok_s", Sample.throughput(tokens, e2e, duration, block=8), 700.0)
    assert v.passed and v.bound == v.lower >= 700.0


def test_ceiling_semantics_for_latency() -> None:
    ttft = np.random.default_rng(4).normal(50.0, 2.0, 400)
    assert judge_floor("ttft_p50_ms", Sample.of(ttft, "median"), 60.0, higher_is_better=False).passed
    v = judge_floor("ttft_p50_ms", Sample.of(ttft, "median"), 45.0, higher_is_better=False)
    assert v.failed and v.bound == v.lower > 45.0


def test_too_short_a_run_is_inconclusive_not_pass() -> None:
    # identical values: a zero-width interval would "pass" on 5 requests; min_n refuses.
    v = judge_floor("output_tok_s", Sample.throughput([128.0] * 5, [1.0] * 5, 5.0), 10.0)
    assert v.outcome == "inconclusive"
    assert v.more_requests == 15
    assert "too short" in v.message


def test_straddling_run_is_inconclusive_and_says_how_many_more_would_decide() -> None:
    rng = np.random.default_rng(6)
    tokens, e2e, duration = _run(rng, 64, speed=100.0, cv=0.5, conc=1)
    s = Sample.throughput(tokens, e2e, duration)
    b = bootstrap_bound(s)
    floor = b.point * 0.97  # inside the interval, point on the pass side
    v = judge_bound("output_tok_s", b, floor)
    assert v.outcome == "inconclusive"
    assert v.more_requests is not None and v.more_requests > 0
    expected = math.ceil(64 * ((b.point - b.lower) / (b.point - floor)) ** 2) - 64
    assert v.more_requests == expected
    assert f"about {expected} more requests" in v.message
    # and that many more requests from the same process do decide (most of the time)
    decided = 0
    for seed in range(20):
        t2, e2, d2 = _run(np.random.default_rng(100 + seed), 64 + 2 * expected, speed=100.0, cv=0.5, conc=1)
        s2 = Sample.throughput(t2, e2, d2)
        decided += judge_floor("x", s2, floor, n_boot=1000).outcome != "inconclusive"
    assert decided >= 10


@pytest.mark.parametrize(("statistic", "n", "runs"), [("mean", 100, 300), ("median", 200, 300), ("p90", 200, 300),
                                                     ("p99", 400, 200), ("ratio", 200, 300)])
def test_clean_noise_at_the_threshold_rarely_fails(statistic: str, n: int, runs: int) -> None:
    """True value exactly at the threshold (the worst case): false 'fail' rate <= nominal 5 % (+ slack).

    Directions as the perf layer uses them: a ceiling on skewed latencies, a floor on throughput.
    """
    fails = passes = 0
    for seed in range(runs):
        rng = np.random.default_rng(10_000 + seed)
        if statistic == "ratio":
            tokens, e2e, duration = _run(rng, n, speed=100.0, cv=0.3)
            v = judge_floor("x", Sample.throughput(tokens, e2e, duration, block=8), 800.0, n_boot=1000, seed=seed)
        else:
            mu, sigma = 3.0, 0.5  # lognormal latencies; the ceiling is the true statistic
            q = {"mean": None, "median": 0.5, "p90": 0.9, "p99": 0.99}[statistic]
            truth = math.exp(mu + sigma**2 / 2) if q is None else math.exp(mu + sigma * NormalDist().inv_cdf(q))
            s = Sample.of(rng.lognormal(mu, sigma, n), statistic)
            v = judge_floor("x", s, truth, higher_is_better=False, n_boot=1000, seed=seed)
        fails += v.failed
        passes += v.passed
    slack = 3 * math.sqrt(0.05 * 0.95 / runs)  # 3 binomial sigmas
    assert fails / runs <= 0.05 + slack, fails
    assert passes / runs <= 0.05 + slack, passes


def test_clean_noise_above_the_floor_never_fails() -> None:
    fails = 0
    for seed in range(200):
        tokens, e2e, duration = _run(np.random.default_rng(seed), 200, speed=100.0, cv=0.3)
        fails += judge_floor("x", Sample.throughput(tokens, e2e, duration, block=8), 760.0,
                             n_boot=1000, seed=seed).failed
    assert fails == 0


def test_regression_against_a_baseline() -> None:
    rng = np.random.default_rng(7)
    base = Sample.throughput(*_run(rng, 200, speed=100.0), block=8)
    slower = Sample.throughput(*_run(rng, 200, speed=85.0), block=8)
    same = Sample.throughput(*_run(rng, 200, speed=100.0), block=8)
    v = judge_regression("output_tok_s vs baseline", slower, base, max_regression_pct=5.0)
    assert v.failed
    assert "baseline" in v.message and "current" in v.message and "5%" in v.message
    assert not judge_regression("output_tok_s vs baseline", same, base, max_regression_pct=5.0).failed
    # a baseline kept only as a number
    assert judge_regression("x", slower, 800.0, max_regression_pct=5.0).failed
    # latency: lower is better
    lat_base = Sample.of(rng.normal(50, 3, 300), "p90")
    lat_new = Sample.of(rng.normal(60, 3, 300), "p90")
    assert judge_regression("ttft", lat_new, lat_base, max_regression_pct=10, higher_is_better=False).failed
    assert judge_regression("ttft", lat_base, lat_new, max_regression_pct=10, higher_is_better=False).passed


def test_regression_does_not_flake_on_same_distribution() -> None:
    fails = 0
    runs = 100
    for seed in range(runs):
        rng = np.random.default_rng(50_000 + seed)
        a = Sample.throughput(*_run(rng, 150, cv=0.3), block=8)
        b = Sample.throughput(*_run(rng, 150, cv=0.3), block=8)
        fails += judge_regression("x", a, b, max_regression_pct=0.0, n_boot=1000, seed=seed).failed
    assert fails / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)


def test_speedup_between_two_services() -> None:
    rng = np.random.default_rng(8)
    ddtree = Sample.throughput(*_run(rng, 200, speed=150.0), block=8)
    dflash = Sample.throughput(*_run(rng, 200, speed=100.0), block=8)
    b = ratio_bound(ddtree, dflash)
    assert b.lower < 1.5 < b.upper or abs(b.point - 1.5) < 0.05
    assert judge_ratio("ddtree speed-up", ddtree, dflash, 1.2).passed
    v = judge_ratio("ddtree speed-up", ddtree, dflash, 2.0)
    assert v.failed and "vs" in v.message


def test_pooled_percentile_resamples_requests() -> None:
    rng = np.random.default_rng(9)
    per_request = [list(rng.normal(10.0, 0.5, 127)) for _ in range(60)]
    s = Sample.pooled(per_request, "p99")
    b = bootstrap_bound(s)
    pooled = np.concatenate([np.asarray(r) for r in per_request])
    assert b.point == pytest.approx(np.percentile(pooled, 99))
    assert b.lower <= b.point <= b.upper
    assert b.n == 60
    # one slow request dominates the pooled p99: the cluster bootstrap sees the uncertainty
    per_request[0] = [30.0] * 127
    wide = bootstrap_bound(Sample.pooled(per_request, "p99"))
    assert wide.upper - wide.lower > 5.0
    mean = bootstrap_bound(Sample.pooled(per_request, "mean"))
    assert mean.point == pytest.approx(np.concatenate([np.asarray(r) for r in per_request]).mean())


def test_sample_validation() -> None:
    with pytest.raises(ValueError, match="statistic"):
        Sample.of([1.0], "p1x")
    with pytest.raises(ValueError, match="denominators"):
        Sample("ratio", np.ones(3))
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_bound(Sample.of([1.0, 2.0]), confidence=0.4)


def _record(i: int, *, ttft: float, e2e: float, tokens: int, verify: int | None = None) -> RequestRecord:
    return RequestRecord(index=i, start_s=i * 0.1, end_s=i * 0.1 + e2e / 1000, ttft_ms=ttft, e2e_ms=e2e,
                         itl_ms=[(e2e - ttft) / (tokens - 1)] * (tokens - 1), output_tokens=tokens,
                         prompt_tokens=10, verify_ct=verify,
                         accept_length=None if verify is None else tokens / verify)


def test_metric_sample_from_a_load_result() -> None:
    recs = [_record(i, ttft=50 + i % 5, e2e=1000 + 10 * (i % 7), tokens=100, verify=40) for i in range(40)]
    spec = LoadSpec(endpoint="generate", concurrency=4, num_requests=40)
    metrics, errors = aggregate(recs, max_concurrency=4)
    result = LoadResult(spec=spec, base_url="http://x", records=recs, metrics=metrics, errors_by_kind=errors,
                        saturation=Saturation())
    tput = bootstrap_bound(metric_sample(result, "output_tok_s"))
    assert tput.point == pytest.approx(metrics["output_throughput"])
    assert bootstrap_bound(metric_sample(result, "accept_length")).point == pytest.approx(2.5)
    assert bootstrap_bound(metric_sample(result, "ttft_p50_ms")).point == pytest.approx(metrics["p50_ttft_ms"])
    assert bootstrap_bound(metric_sample(result, "itl_mean_ms")).point == pytest.approx(metrics["mean_itl_ms"])
    with pytest.raises(ValueError, match="unknown metric"):
        metric_sample(result, "speed")
