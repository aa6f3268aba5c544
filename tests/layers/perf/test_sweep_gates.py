"""Gates on a sweep's curve (layers/perf/sweep/gates.py) and the sweep's runner (run.py), on a sweep recorded
against real refservers (tests/data/refserver-sweep: DFLASH is 1.43x NONE at concurrency 1, 0.98x at 4 and
0.78x at 8): the crossover names its level and bound, a level not measured is inconclusive, never a pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_dflash.layers.perf.sweep.build import curve_from_files, per_request_slo
from pytest_dflash.layers.perf.sweep.gates import (
    gate_crossover,
    gate_goodput,
    gate_max_concurrency,
    judge_gates,
    levels_up_to,
)
from pytest_dflash.layers.perf.sweep.plan import SweepPlan
from pytest_dflash.layers.perf.sweep.run import SweepRecord, SweepService, run_sweep
from pytest_dflash.load.curve import SweepCurve
from pytest_dflash.load.results import LoadResult

DATA = Path(__file__).parents[2] / "data" / "refserver-sweep"
SLO = {"e2e_p90_ms": 150.0, "ttft_p90_ms": 100.0}


def _runs() -> dict[tuple[str, int], LoadResult]:
    runs = {}
    for path in DATA.glob("*.json"):
        result = LoadResult.from_json(path.read_text())
        runs[(path.stem.split("-")[0], int(result.spec.concurrency or 1))] = result
    return runs


@pytest.fixture(scope="module")
def recorded() -> SweepRecord:
    curve = curve_from_files(DATA.glob("*.json"), host="refserver", slo=SLO)
    return SweepRecord(curve=curve, results=_runs())


def test_a_curve_is_built_from_load_run_files_and_states_the_crossover(recorded: SweepRecord) -> None:
    curve = recorded.curve
    assert curve.levels == (1, 4, 8)
    assert {s.service: s.algorithm for s in curve.services} == {"dflash": "DFLASH", "none": "NONE"}
    speedup = curve.speedup("dflash", "none")
    assert speedup is not None and speedup.crossover == 8
    assert speedup.crossover_text is not None
    assert speedup.crossover_text.startswith("dflash (DFLASH) is slower than none from concurrency 8 (0.78x, "
                                             "95% upper bound 0.85x)")
    low = speedup.at(1)
    assert low is not None and low.ratio is not None and low.ratio.lower is not None and low.ratio.lower > 1
    none = curve.service("none")
    assert none is not None
    level = none.at(8)
    assert level is not None and level.slo_outcome == "fail" and level.goodput_req_s is not None
    assert level.output_tok_s is not None and level.goodput_req_s.point < level.output_tok_s.point
    assert SweepCurve.from_json(curve.to_json()) == SweepCurve.from_json(curve.to_json())


def test_the_crossover_gate_fails_at_the_level_naming_the_bound_and_passes_below_it(
        recorded: SweepRecord) -> None:
    failed = gate_crossover(recorded, "dflash", "none", 16)
    assert failed.outcome == "fail" and failed.level == 8
    assert failed.message.startswith("crossover_vs_none: FAIL at concurrency 8 — 0.78x, 95% upper bound 0.85x "
                                      "< min_speedup 1x (asked up to concurrency 16")
    passed = gate_crossover(recorded, "dflash", "none", 1)
    assert passed.outcome == "pass", passed.message
    assert "the crossover: dflash (DFLASH) is slower than none from concurrency 8" in passed.message
    # at 4 the interval straddles 1x: undecided, not a pass
    assert gate_crossover(recorded, "dflash", "none", 4).outcome == "inconclusive"
    # a dearer floor fails where the speed-up is confidently below it
    assert gate_crossover(recorded, "dflash", "none", 1, min_speedup=2.0).outcome == "fail"


def test_max_concurrency_within_slo_names_the_level_that_breaks(recorded: SweepRecord) -> None:
    gate = gate_max_concurrency(recorded, "dflash", 8)
    assert gate.outcome == "fail" and gate.level == 8, gate.message
    assert gate.message.startswith("max_concurrency_within_slo: FAIL — concurrency 8 breaks its SLOs "
                                   "(e2e_p90_ms: FAIL")
    assert gate.message.endswith("the highest level within the SLOs is 1 < 8")
    assert gate_max_concurrency(recorded, "none", 1).outcome == "pass"


def test_goodput_at_a_level_is_judged_on_its_bound(recorded: SweepRecord) -> None:
    assert gate_goodput(recorded, "none", 4, 10.0).outcome == "pass"
    failed = gate_goodput(recorded, "none", 4, 50.0)
    assert failed.outcome == "fail" and "95% upper bound" in failed.message and "< floor 50 req/s" in failed.message
    missing = gate_goodput(recorded, "none", 16, 1.0)
    assert missing.outcome == "inconclusive"
    assert "concurrency 16 is not a level of this sweep (1, 4, 8)" in missing.message


def test_judge_gates_reads_the_floors(recorded: SweepRecord) -> None:
    gates = judge_gates(recorded, "dflash", {"max_concurrency_within_slo": 1, "goodput_at.1": 5.0,
                                             "crossover_vs": "none", "speedup_up_to": 1, "min_speedup": 1.1})
    assert [g.outcome for group in gates.values() for g in group] == ["pass", "pass", "pass"]


def test_levels_up_to_covers_n_with_the_first_level_at_or_above_it() -> None:
    assert levels_up_to([1, 4, 16, 64], 10) == ([1, 4, 16], 16)
    assert levels_up_to([1, 4, 16], 16) == ([1, 4, 16], 16)
    assert levels_up_to([1, 4], 16) == ([1, 4], None)


def test_goodput_counts_a_request_against_every_objective() -> None:
    slo = per_request_slo({"ttft_p50_ms": 50.0, "ttft_p99_ms": 200.0, "tpot_p99_ms": 20.0})
    assert (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms, slo.itl_ms) == (200.0, 20.0, None, None)


# ---- the runner: interleaving, the budget, the early stop (load runs replayed from the recording) ----


class Replay:
    """Loads a service at a level by handing back the recorded run (and logs the order)."""

    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name, self.log, self.runs = name, log, _runs()

    def __call__(self, level: int) -> LoadResult:
        self.log.append((self.name, level))
        return self.runs[(self.name, level)]


def _clock(step: float) -> Iterator[float]:
    t = 0.0
    while True:
        yield t
        t += step


def _services(log: list[tuple[str, int]], slo: dict[str, float]) -> list[SweepService]:
    return [SweepService("none", "NONE", Replay("none", log), slo),
            SweepService("dflash", "DFLASH", Replay("dflash", log), slo)]


def test_levels_are_interleaved_with_the_order_alternating() -> None:
    log: list[tuple[str, int]] = []
    record = run_sweep("h", SweepPlan(levels=(1, 4, 8)), _services(log, {}))
    assert log == [("none", 1), ("dflash", 1), ("dflash", 4), ("none", 4), ("none", 8), ("dflash", 8)]
    assert record.curve.speedup("dflash", "none") is not None


def test_a_spent_budget_leaves_levels_not_run_and_the_gate_inconclusive() -> None:
    log: list[tuple[str, int]] = []
    ticks = _clock(25.0)  # every clock reading advances 25 s: the 2m budget runs out during level 4
    record = run_sweep("h", SweepPlan(levels=(1, 4, 8), budget_s=120.0), _services(log, {}),
                       clock=lambda: next(ticks))
    none = record.curve.service("none")
    assert none is not None
    skipped = none.at(8)
    assert skipped is not None and not skipped.measured and skipped.why == "not run: sweep_budget 2m spent"
    gate = gate_crossover(record, "dflash", "none", 8)
    assert gate.outcome == "inconclusive" and "not run: sweep_budget 2m spent" in gate.message
    assert json.loads(record.curve.to_json())["services"][0]["levels"][2]["status"] == "not_run"


def test_a_level_that_breaks_its_slos_twice_stops_the_service() -> None:
    log: list[tuple[str, int]] = []
    tight = {"e2e_p90_ms": 110.0}  # concurrency 4 breaks it (NONE: 128 ms, DFLASH: 160 ms at p90)
    record = run_sweep("h", SweepPlan(levels=(1, 4, 8)), _services(log, tight))
    assert log.count(("dflash", 4)) == 2 and ("dflash", 8) not in log  # measured again, then stopped
    dflash = record.curve.service("dflash")
    assert dflash is not None and dflash.stopped is not None
    assert dflash.stopped.startswith("not run: early stop — dflash broke its SLOs twice at concurrency 4")
    level = dflash.at(4)
    assert level is not None and level.attempts == 2
    assert gate_max_concurrency(record, "dflash", 8).outcome == "fail"


@pytest.mark.parametrize(("path", "service"), [
    ("runs/dflash-c16.json", "dflash"), ("runs/none_16.json", "none"), ("runs/ddtree.c4.json", "ddtree"),
    ("runs/ngram-concurrency64.json", "ngram"), ("runs/c16-dflash.json", "dflash"), ("dflash/c16.json", "dflash"),
    ("c16/plain.json", "plain")])
def test_a_run_file_names_its_service(tmp_path: Path, path: str, service: str) -> None:
    source = DATA / "dflash-c4.json"
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    target.write_text(source.read_text())
    curve = curve_from_files([target], host="h")
    assert [(s.service, s.algorithm) for s in curve.services] == [(service, "NONE" if service == "plain" else
                                                                     service.upper())]


def test_the_command_line_writes_the_curve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_dflash.layers.perf.sweep.__main__ import main

    out = tmp_path / "sweep.json"
    assert main([str(DATA), "--host", "refserver", "--slo", "e2e_p90_ms=150", "--out", str(out)]) == 0
    assert "the crossover: dflash (DFLASH) is slower than none from concurrency 8" in capsys.readouterr().out
    curve = SweepCurve.from_json(out.read_text())
    assert curve.host == "refserver" and curve.slo == {"e2e_p90_ms": 150.0}
    assert main([str(DATA / "dflash-c1.json"), str(DATA / "dflash-c1.json"), "--host", "h"]) == 2
    assert "a second run of dflash at concurrency 1" in capsys.readouterr().err
