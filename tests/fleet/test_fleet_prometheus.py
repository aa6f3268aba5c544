"""The Prometheus textfile: valid exposition (parsed back strictly, and by prometheus_client when installed),
escaping, atomic write, and exactly the fleet's state."""

from __future__ import annotations

import math
import os
import stat
import threading
from pathlib import Path

import pytest
from support.fleet_helpers import BROKEN, GREEN, make_verdict
from support.promparse import parse

from pytest_dflash.fleet import summary as fleet
from pytest_dflash.fleet import verdicts as fleet_verdicts
from pytest_dflash.fleet.prometheus import (
    METRICS,
    Exposition,
    escape_label,
    fleet_exposition,
    format_value,
    write_textfile,
)


def _summary(tmp_path: Path, **kwargs):  # type: ignore[no-untyped-def]
    verdicts, excluded = fleet_verdicts.load_verdicts([tmp_path / "in"])
    return fleet.build_summary(verdicts, excluded=excluded, **kwargs)


def test_exposition_shows_exactly_the_fleet_state(tmp_path: Path) -> None:
    make_verdict(tmp_path / "in", "gpu-a", GREEN, metrics={"perf": {"dflash": {"output_throughput": 812.5, "p99_ttft_ms": 40, "output_tok_s.bound": 790.0}}, "token_latency:none": {"ttft_ms": 30.0, "ceiling_ms": 250.0}})
    make_verdict(tmp_path / "in", "gpu-b", BROKEN)
    families = parse(fleet_exposition(_summary(tmp_path, gate_layers=["service", "generation"])))
    for name, family in families.items():
        assert family.type == "gauge" and family.help == METRICS[name], name
    assert families["dflash_host_pass"].value(host="gpu-a") == 1
    assert families["dflash_host_pass"].value(host="gpu-b") == 0
    assert families["dflash_fleet_hosts"].value(verdict="pass") == 1
    assert families["dflash_fleet_hosts"].value(verdict="fail") == 1
    assert families["dflash_fleet_gate_pass"].value(layers="service,generation") == 0
    outcomes = {(s["host"], s["layer"]): s["outcome"] for s in families["dflash_layer_outcome"].series()}
    assert outcomes == {("gpu-a", "host"): "passed", ("gpu-a", "service"): "passed",
                        ("gpu-a", "generation"): "passed", ("gpu-b", "host"): "passed",
                        ("gpu-b", "service"): "failed", ("gpu-b", "generation"): "blocked"}
    assert families["dflash_failure_diagnosis"].series() == [
        {"host": "gpu-b", "layer": "service", "diagnosis": "flashinfer-sm12x-nvcc"}]
    assert families["dflash_host_failed_tests"].value(host="gpu-b") == 1
    assert families["dflash_host_blocked_tests"].value(host="gpu-b") == 1
    assert families["dflash_service_ready_seconds"].value(host="gpu-a", service="dflash", algorithm="DFLASH") == 70.5
    assert families["dflash_service_accept_length"].value(host="gpu-a", service="dflash", algorithm="DFLASH") == 3.6
    assert families["dflash_service_info"].value(host="gpu-a", service="dflash", algorithm="DFLASH",
                                                  version="0.5.17") == 1
    assert families["dflash_perf"].value(host="gpu-a", metric="perf.dflash.output_throughput") == 812.5
    assert families["dflash_perf"].value(host="gpu-a", metric="perf.dflash.p99_ttft_ms") == 40
    assert families["dflash_perf"].value(host="gpu-a", metric="token_latency:none.ttft_ms") == 30
    # measurements only: a threshold (a ceiling, a judged bound) is not charted as if it were measured
    assert {s["metric"] for s in families["dflash_perf"].series()} == {
        "perf.dflash.output_throughput", "perf.dflash.p99_ttft_ms", "token_latency:none.ttft_ms"}
    assert families["dflash_host_run_timestamp_seconds"].value(host="gpu-a") > 1.7e9
    assert families["dflash_host_failing_since_timestamp_seconds"].series() == [{"host": "gpu-b"}]
    assert families["dflash_fleet_summary_timestamp_seconds"].value() > 1.7e9


def test_label_values_are_escaped_and_parse_back(tmp_path: Path) -> None:
    nasty = 'gpu "7"\\rack\nb'
    make_verdict(tmp_path / "in", nasty, BROKEN,
                 diagnosis=[{"id": 'id"with\\quote', "title": "t", "remedy": ""}])
    text = fleet_exposition(_summary(tmp_path))
    assert 'host="gpu \\"7\\"\\\\rack\\nb"' in text
    families = parse(text)
    assert families["dflash_host_pass"].value(host=nasty) == 0
    assert families["dflash_failure_diagnosis"].series()[0]["diagnosis"] == 'id"with\\quote'


def test_prometheus_client_parser_agrees(tmp_path: Path) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    make_verdict(tmp_path / "in", "gpu-a", GREEN, metrics={"tok_s": 10.25})
    make_verdict(tmp_path / "in", 'we"ird\\host\nx', BROKEN)
    text = fleet_exposition(_summary(tmp_path, gate_layers=["service"]))
    mine = parse(text)
    theirs = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert set(theirs) == set(mine)
    for name, family in theirs.items():
        assert family.type == "gauge" and family.documentation == METRICS[name]
        got = {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        assert got == mine[name].samples, name


def test_values_and_invalid_names() -> None:
    assert [format_value(v) for v in (1.0, 0.5, math.nan, math.inf, -math.inf, 1e20)] == [
        "1", "0.5", "NaN", "+Inf", "-Inf", "1e+20"]
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    out = Exposition()
    with pytest.raises(KeyError):
        out.add("dflash_not_documented", {}, 1)
    with pytest.raises(ValueError, match="label name"):
        out.add("dflash_host_pass", {"bad-label": "x"}, 1)
    out.add("dflash_host_pass", {"host": "a"}, 1)
    out.add("dflash_host_pass", {"host": "a"}, 0)  # a duplicate series is dropped, not written twice
    assert parse(out.render())["dflash_host_pass"].value(host="a") == 1


def test_textfile_write_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "collector" / "dflash.prom"
    write_textfile(target, "# HELP dflash_host_pass x\n# TYPE dflash_host_pass gauge\ndflash_host_pass 1\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    old_reader = target.open()  # a reader that opened the old file keeps reading the old file (rename, not rewrite)
    seen: list[str] = []
    stop = threading.Event()

    def reader() -> None:  # a collector scraping while the file is rewritten never sees a partial file
        while not stop.is_set():
            seen.append(target.read_text())

    thread = threading.Thread(target=reader)
    thread.start()
    big = "# HELP dflash_host_pass x\n# TYPE dflash_host_pass gauge\n" + "".join(
        f'dflash_host_pass{{host="h{i}"}} 1\n' for i in range(20000))
    try:
        for _ in range(10):
            write_textfile(target, big)
    finally:
        stop.set()
        thread.join()
    assert target.read_text() == big
    with old_reader:
        assert old_reader.read().endswith("dflash_host_pass 1\n") and "h0" not in old_reader.read()
    assert all(text.endswith("\n") and (len(text) < 100 or text == big) for text in seen)
    assert sorted(os.listdir(target.parent)) == ["dflash.prom"], "no temporary file is left behind"


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "dflash.prom"
    write_textfile(target, "old\n")

    def boom(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_textfile(target, "new\n")
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["dflash.prom"]


def test_a_sweep_is_charted_per_service_and_level_and_its_crossover_named(tmp_path: Path) -> None:
    sweep = {"c1": {"output_tok_s": 300.0, "output_tok_s.lower": 280.0, "goodput_req_s": 20.0, "slo_pass": 1.0,
                    "speedup_vs_none": 1.4},
             "c16": {"output_tok_s": 900.0, "ttft_p99_ms": 120.0, "speedup_vs_none": 0.8},
             "crossover_vs_none": 16.0, "crossover_vs_none.pass": 0.0}
    make_verdict(tmp_path / "in", "gpu-a", GREEN, metrics={"perf": {"dflash": {"sweep": sweep}}})
    families = parse(fleet_exposition(_summary(tmp_path)))
    series = {(s["service"], s["level"], s["metric"]): families["dflash_perf_sweep"].value(**s)
              for s in families["dflash_perf_sweep"].series()}
    assert series == {("dflash", "1", "output_tok_s"): 300.0, ("dflash", "1", "goodput_req_s"): 20.0,
                      ("dflash", "1", "speedup_vs_none"): 1.4, ("dflash", "16", "output_tok_s"): 900.0,
                      ("dflash", "16", "ttft_p99_ms"): 120.0, ("dflash", "16", "speedup_vs_none"): 0.8}
    assert families["dflash_perf_crossover_concurrency"].value(host="gpu-a", service="dflash", versus="none") == 16
