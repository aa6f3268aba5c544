"""The throughput interval the perf layer publishes for the fleet trend (issue 26): two runs of one load whose
requests vary run to run overlap, a run at half the throughput does not."""

from __future__ import annotations

from perf_fakes import fake_run

from pytest_dflash.fleet.trend import perf_deltas
from pytest_dflash.layers.perf.book import throughput_interval


def _numbers(seed: int, e2e_ms: float = 100.0) -> dict[str, float]:
    run = fake_run(seed=seed, e2e_ms=e2e_ms)
    return {**run.metrics(), **throughput_interval(run)}


def test_the_interval_brackets_the_throughput() -> None:
    numbers = _numbers(0)
    point = numbers["perf.dflash.output_throughput"]
    lower, upper = numbers["perf.dflash.output_throughput.lower"], numbers["perf.dflash.output_throughput.upper"]
    assert lower < point < upper and upper - lower < 0.1 * point


def test_noise_between_runs_is_not_a_regression_but_half_the_throughput_is() -> None:
    key = "perf.dflash.output_throughput"
    same = perf_deltas(_numbers(0), _numbers(2), 5.0)[key]
    assert same["current"] < same["previous"] and not same["regression"]
    assert same["rule"].endswith("overlap: within run-to-run spread"), same
    # 3% slower: the (tight) intervals part, but a change under the perf threshold is not a regression
    slower = perf_deltas(_numbers(0), _numbers(1, e2e_ms=103.0), 5.0)[key]
    assert not slower["regression"] and slower["rule"].endswith("do not overlap, but the change is under 5%"), slower
    halved = perf_deltas(_numbers(0), _numbers(1, e2e_ms=200.0), 5.0)[key]
    assert halved["regression"] and halved["rule"].endswith("do not overlap"), halved
