"""The perf layer's numbers, recomputed from the load generator's records of real DDTREE / DFLASH / plain servers on
the H200 (tests/data/sglang-0.5.17-h200-ddtree/run3-*/perf/*.json, run4-*/perf/*.json.gz; the high-acceptance
pair): aggregation, the
token-weighted accept length and the bootstrap speed-up bounds give exactly what the device run reported, and the
budget orders DDTREE's accept length the way the pair was built to (3 / 5 / 6 tokens per step at budget 8 / 32 /
64, DFLASH 2)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pytest_dflash.layers.perf.stats import metric_sample
from pytest_dflash.layers.perf.verdicts import judge_floor, judge_ratio
from pytest_dflash.load.results import LoadResult, aggregate

DATA = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h200-ddtree"
# run 4's records are gzipped (as recorded, 10x smaller): the device carries this checkout within 64 MiB
RUNS = sorted([*DATA.glob("run3-*/perf/*.json"), *DATA.glob("run4-*/perf/*.json.gz")])


def read(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def record_path(run: str, service: str) -> Path:
    plain = DATA / run / "perf" / f"{service}.json"
    return plain if plain.exists() else plain.with_name(plain.name + ".gz")


def load(run: str, service: str) -> LoadResult:
    return LoadResult.from_json(read(record_path(run, service)))


def judgement(run: str, service: str, key: str) -> dict[str, object]:
    recorded = json.loads(read(record_path(run, service)))["dflash_perf"]["judgements"]
    return next(j for j in recorded if j["key"] == key)


def test_the_recordings_are_there() -> None:
    assert {p.parent.parent.name for p in RUNS} >= {"run3-accept", "run3-configs", "run3-configs2", "run4-accept",
                                                     "run4-fi-parity"}


@pytest.mark.parametrize("path", RUNS, ids=lambda p: f"{p.parent.parent.name}/{p.name.split('.')[0]}")
def test_aggregates_are_reproduced_from_the_records(path: Path) -> None:
    result = LoadResult.from_json(read(path))
    metrics, errors = aggregate(result.records, max_concurrency=result.metrics["max_concurrency"])
    requests = {"run4-accept": 240, "run4-fi-parity": 200}.get(path.parent.parent.name, 80)  # run 4: longer runs
    assert errors == {} and metrics["completed"] == result.metrics["completed"] == requests
    for key in ("total_output_tokens", "duration", "output_throughput", "p50_ttft_ms", "p99_itl_ms"):
        # the records keep times to 0.1 ms (RequestRecord.to_dict), the aggregates were taken before rounding
        assert metrics[key] == pytest.approx(result.metrics[key], rel=1e-4), key
    if result.metrics.get("mean_accept_length") is not None:
        assert metrics["mean_accept_length"] == pytest.approx(result.metrics["mean_accept_length"], rel=1e-4)


@pytest.mark.parametrize(("run", "service", "designed", "tokens"), [
    ("run3-accept", "dflash_acc", 2.0, 64), ("run3-accept", "ddtree_acc_b8", 3.0, 64),
    ("run3-accept", "ddtree_acc", 5.0, 64), ("run3-configs2", "ddtree_acc_b64", 6.0, 64),
    ("run3-configs", "ddtree_acc_prod", 5.0, 64), ("run3-configs", "dflash_acc_prod", 2.0, 64),
    ("run4-accept", "dflash_acc", 2.0, 64), ("run4-accept", "ddtree_acc_b8", 3.0, 64),
    ("run4-accept", "ddtree_acc", 5.0, 64),
    ("run4-fi-parity", "ddtree_acc_fi", 5.0, 128),  # the flashinfer backend: the default load, 128 tokens
])
def test_accept_length_is_the_designed_one(run: str, service: str, designed: float, tokens: int) -> None:
    sample = metric_sample(load(run, service), "accept_length")
    verdict = judge_floor("accept_length", sample, 0.9 * designed)
    assert verdict.outcome == "pass"
    # N tokens per request, the first from the prefill: N / ceil((N - 1) / designed) steps (b8: 64/21 = 3.05)
    assert verdict.point == pytest.approx(tokens / -(-(tokens - 1) // designed))
    assert verdict.point == pytest.approx(judgement(run, service, "accept_length")["point"])


def test_the_tree_budget_orders_the_accept_length() -> None:
    points = [judge_floor("accept_length", metric_sample(load(run, service), "accept_length"), 1.0).point
              for run, service in (("run3-accept", "dflash_acc"), ("run3-accept", "ddtree_acc_b8"),
                                   ("run3-accept", "ddtree_acc"), ("run3-configs2", "ddtree_acc_b64"))]
    assert points == sorted(points) and len(set(points)) == 4


@pytest.mark.parametrize(("run", "service", "versus", "floor", "outcome"), [
    ("run3-accept", "ddtree_acc", "dflash_acc", 1.5, "pass"),           # 2.16x [1.95, 2.41]
    ("run3-accept", "ddtree_acc_b8", "dflash_acc", 1.0, "pass"),        # 1.32x [1.22, ...]
    ("run3-accept", "dflash_acc", "plain_acc", 1.0, "inconclusive"),    # 1.09x [0.99, 1.20]: straddles 1
    ("run3-configs", "ddtree_acc_prod", "dflash_acc_prod", 1.2, "inconclusive"),  # 1.15x [1.04, 1.26]
    ("run4-accept", "ddtree_acc", "dflash_acc", 1.5, "pass"),           # 1.86x [1.74, 1.98], 240 requests
    ("run4-accept", "ddtree_acc_b8", "dflash_acc", 1.0, "pass"),        # 1.38x [1.28, 1.48]
    ("run4-accept", "dflash_acc", "plain_acc", 1.0, "inconclusive"),    # 1.01x [0.95, 1.06]: still straddles 1
    ("run4-fi-parity", "ddtree_acc_fi", "plain_acc", 1.0, "pass"),      # 2.72x [2.55, 2.91]
])
def test_speedup_verdicts_are_reproduced(run: str, service: str, versus: str, floor: float, outcome: str) -> None:
    a = metric_sample(load(run, service), "output_tok_s")
    b = metric_sample(load(run, versus), "output_tok_s")
    verdict = judge_ratio(f"speed-up {service} / {versus}", a, b, floor)
    recorded = judgement(run, service, f"speedup_vs_{versus}")
    assert verdict.outcome == recorded["outcome"] == outcome
    assert verdict.point == pytest.approx(recorded["point"])
    assert verdict.lower == pytest.approx(recorded["lower"]) and verdict.upper == pytest.approx(recorded["upper"])
