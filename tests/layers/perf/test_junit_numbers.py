"""JUnit carries a perf run's measurements as flat properties (docs/gating.md), on a real recorded H200 run."""

from __future__ import annotations

from pathlib import Path

from pytest_dflash.evidence.attach import junit_user_properties
from pytest_dflash.layers.perf.judgement import Comparison, Judgement
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.load import LoadResult

PERF = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h200-ddtree" / "run2-three" / "perf"


def test_the_measurements_are_flat_properties_without_thresholds() -> None:
    result = LoadResult.from_json((PERF / "dflash.json").read_text())
    run = ServiceRun(host="h200", service="dflash", algorithm="DFLASH", settings=PerfSettings(), result=result)
    run.judge([Judgement(key="output_tok_s", outcome="fail", message="m", threshold=900.0, bound=590.0)])
    run.comparisons["none"] = Comparison(service="dflash", versus="none", algorithm="DFLASH",
                                         versus_algorithm="NONE", point=1.0812, lower=1.0, upper=1.2,
                                         confidence=0.95, concurrency=8, accept_length=None,
                                         versus_accept_length=None)
    properties = dict(junit_user_properties(run.junit_properties()))
    m = result.metrics
    assert properties == {
        "dflash.perf.dflash.output_tok_s": round(m["output_throughput"], 4),
        "dflash.perf.dflash.ttft_p50_ms": round(m["median_ttft_ms"], 4),
        "dflash.perf.dflash.ttft_p99_ms": round(m["p99_ttft_ms"], 4),
        "dflash.perf.dflash.itl_p50_ms": round(m["median_itl_ms"], 4),
        "dflash.perf.dflash.itl_p99_ms": round(m["p99_itl_ms"], 4),
        "dflash.perf.dflash.tpot_mean_ms": round(m["mean_tpot_ms"], 4),
        "dflash.perf.dflash.accept_length": round(run.accept_length or 0.0, 4),
        "dflash.perf.dflash.speedup_vs_none": 1.0812,
    }
