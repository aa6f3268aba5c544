"""Perf: each service under load, judged on confidence bounds against the host's floors, baseline and peers.

    pytest --host local suites/perf
    pytest --host ct200 suites/perf --html reports/perf.html
    pytest --host ct200 suites/perf --update-baseline        # record a good run as the baseline

One load run per service (the profile's [perf] table) serves every test below. Each judgement passes, fails
(measured value, bound, confidence and threshold in the message), or is INCONCLUSIVE (too short a run: the
message says how many more requests would decide) or REFUSED (the load client was saturated): the last two
fail the test too — never a silent pass. Numbers go to reports/perf/<host>/<service>.json (bench_serving's
field names), the verdict's metrics (perf.<service>.*) and the terminal summary; plots to the HTML row.

With [perf] sweep (or --perf-sweep 1,4,16), the last three tests judge a load sweep of the host (every
service at each concurrency level, interleaved): the [slo] table per level, goodput, and where speculation
stops paying against the plain twin; the curve goes to reports/perf/<host>/sweep.json.
"""

from __future__ import annotations

import pytest

from pytest_dflash.api import PerfLayer, ServiceHandle, needs_sglang

pytestmark = pytest.mark.perf


def test_throughput_and_latency_floors(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """No request fails; output tok/s >= its floor, TTFT/ITL percentiles <= their ceilings
    ([floors.SERVICE])."""
    dflash_perf.floors_of(dflash_service)


@pytest.mark.dflash_services(speculative=True)
def test_accept_length(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """Per-request accept length (native /generate meta_info) >= its floor; server-side /server_info
    alongside."""
    needs_sglang(dflash_service, "accept length needs SGLang's native /generate meta_info")
    dflash_perf.accept_length_of(dflash_service)


def test_speedup(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """Output tok/s over another service's at the same load >= `speedup` (floors: speedup_vs, speedup)."""
    dflash_perf.speedup_of(dflash_service)


def test_no_regression_from_baseline(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """Not worse than the recorded baseline by more than regression_pct; --update-baseline records a good
    run."""
    dflash_perf.baseline_of(dflash_service)


def test_sweep_within_slo(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """Load sweep ([perf] sweep): every level up to max_concurrency_within_slo meets the [slo] table, judged
    on confidence bounds."""
    dflash_perf.sweep_within_slo_of(dflash_service)


def test_goodput_floor(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """Load sweep: requests/s within the SLOs at a level >= its floor (goodput_at = {16 = 5.0})."""
    dflash_perf.goodput_of(dflash_service)


@pytest.mark.dflash_services(speculative=True)
def test_crossover(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """Load sweep: output tok/s over the plain twin's (crossover_vs) >= min_speedup at every level up to
    speedup_up_to; the level where speculation stops paying is named with its bound."""
    dflash_perf.crossover_of(dflash_service)
