"""The sweep's data model (load/curve.py): sweep.json round-trips, keeps not-run levels with
their reason, and is strict JSON (a bound that is not finite is written as null)."""

from __future__ import annotations

import json
import math

import pytest

from pytest_dflash.load.curve import (
    FORMAT,
    GateResult,
    Interval,
    LevelPoint,
    ServiceCurve,
    SloCheck,
    SpeedupCurve,
    SpeedupPoint,
    SweepCurve,
)


def _curve() -> SweepCurve:
    measured = LevelPoint(
        concurrency=1, requests=40, duration_s=3.2, output_tok_s=Interval(point=410.0, lower=398.0, upper=421.5),
        request_per_s=Interval(point=12.5, lower=12.1, upper=12.9),
        latency={"ttft_p50_ms": 10.0, "ttft_p99_ms": 14.0, "tpot_p99_ms": 2.5, "e2e_p99_ms": 90.0},
        goodput_req_s=Interval(point=12.5, lower=12.0, upper=12.9), goodput_tok_s=Interval(point=400.0, lower=390.0,
                                                                                          upper=math.inf),
        goodput_fraction=1.0, slo_outcome="pass",
        slo_checks=(SloCheck(key="ttft_p99_ms", threshold=200.0, outcome="pass", message="ttft_p99_ms: pass",
                             point=14.0, lower=12.0, upper=15.0),),
        accept_length=4.9)
    dflash = ServiceCurve(service="dflash", algorithm="DFLASH", slo={"ttft_p99_ms": 200.0},
                          levels=(measured, LevelPoint.not_run(16, "not run: sweep_budget 2m spent")))
    none = ServiceCurve(service="none", algorithm="NONE", levels=(
        LevelPoint(concurrency=1, output_tok_s=Interval(point=100.0, lower=95.0, upper=104.0)),
        LevelPoint.not_run(16, "not run: sweep_budget 2m spent")))
    speedup = SpeedupCurve(service="dflash", versus="none", algorithm="DFLASH", versus_algorithm="NONE",
                           points=(SpeedupPoint(concurrency=1, ratio=Interval(point=4.1, lower=3.9, upper=4.3)),
                                   SpeedupPoint(concurrency=16, why="not run: sweep_budget 2m spent")))
    gate = GateResult(service="dflash", key="crossover_vs_none", outcome="inconclusive",
                      message="crossover vs none: INCONCLUSIVE — concurrency 16 not run", level=16, threshold=1.0)
    return SweepCurve(host="local", levels=(1, 16), services=(none, dflash), speedups=(speedup,), gates=(gate,),
                      load={"endpoint": "generate", "output_len": 16}, slo={"ttft_p99_ms": 200.0}, budget_s=120.0,
                      spent_s=31.5, written="2026-12-06T13:40:00+0000")


def test_a_curve_round_trips_through_json() -> None:
    curve = _curve()
    text = curve.to_json()
    doc = json.loads(text)
    assert doc["format"] == FORMAT
    back = SweepCurve.from_json(text)
    # the infinite bound was written as null: everything else is the same
    dflash = back.service("dflash")
    assert dflash is not None
    level = dflash.at(1)
    assert level is not None and level.goodput_tok_s is not None and level.goodput_tok_s.upper is None
    assert back.to_json() == text
    assert back.services[0] == curve.services[0]
    assert back.speedups == curve.speedups and back.gates == curve.gates


def test_a_level_not_run_keeps_its_reason_and_no_numbers() -> None:
    back = SweepCurve.from_json(_curve().to_json())
    none = back.service("none")
    assert none is not None
    assert [p.concurrency for p in none.measured] == [1]
    skipped = none.at(16)
    assert skipped is not None and not skipped.measured and skipped.why == "not run: sweep_budget 2m spent"
    assert skipped.output_tok_s is None
    speedup = back.speedup("dflash", "none")
    assert speedup is not None and speedup.crossover is None
    point = speedup.at(16)
    assert point is not None and point.ratio is None and point.why


def test_another_format_is_refused_in_one_line() -> None:
    doc = _curve().to_dict()
    doc["format"] = "something/else"
    with pytest.raises(ValueError, match="format 'something/else'"):
        SweepCurve.from_dict(doc)
