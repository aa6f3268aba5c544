"""Plots that tell the truth: each mean on a plot is the headline's number, the floors and ceilings judged are
drawn (and marked when failed), the partial last bin is not drawn as a collapse, and labels fit the SVG —
on a real recorded H200 DFLASH load run (tests/data/sglang-0.5.17-h200-ddtree/run2-three/perf)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.svgtext import NS, overflowing_texts, texts

from pytest_dflash.layers.perf.judgement import Judgement
from pytest_dflash.layers.perf.report import svg_plots
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.load import LoadResult
from pytest_dflash.report.plots import cold_start_timeline_svg, readiness_spread_svg, text_width

PERF = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-ddtree" / "run2-three" / "perf"


def _run(name: str = "dflash", *judgements: Judgement) -> ServiceRun:
    result = LoadResult.from_json((PERF / f"{name}.json").read_text())
    run = ServiceRun(host="h200", service=name, algorithm="DFLASH", settings=PerfSettings(), result=result)
    run.judge(judgements)
    return run


def test_the_tokens_plot_mean_is_the_headline_output_tok_s() -> None:
    run = _run()
    headline = re.search(r"([\d.]+) output tok/s", run.headline())
    assert headline is not None
    drawn = texts(svg_plots(run)["tokens_over_time"])
    assert f"mean {headline.group(1)} tok/s (the headline)" in drawn, drawn


def test_the_histogram_mean_is_the_headline_accept_length() -> None:
    run = _run()
    headline = re.search(r"accept length ([\d.]+)", run.headline())
    assert headline is not None
    drawn = texts(svg_plots(run)["accept_length"])
    assert any(t.startswith(f"accept length {headline.group(1)} (Σ tokens / Σ verify steps)") for t in drawn), drawn


def test_the_partial_last_bin_is_marked_not_drawn_as_a_collapse() -> None:
    svg = svg_plots(_run())["tokens_over_time"]
    root = ET.fromstring(svg)
    (line,) = root.iter(f"{NS}polyline")
    (partial,) = [c for c in root.iter(f"{NS}circle") if c.get("class") == "dflash-partial-bin"]
    last_x = float(line.get("points", "").split()[-1].split(",")[0])
    assert float(partial.get("cx", "0")) > last_x  # the recorded run's 4.7 s bin holds 0.04 s of tokens
    assert "last bin partial (not in the line)" in " ".join(texts(svg))


@pytest.mark.parametrize(("key", "plot", "outcome", "text"), [
    ("output_tok_s", "tokens_over_time", "fail", "floor output_tok_s 700 FAILED"),
    ("accept_length", "accept_length", "pass", "floor accept_length 1.2"),
    ("ttft_p99_ms", "latency_cdf", "fail", "ceiling ttft_p99_ms 50 FAILED"),
])
def test_floors_and_ceilings_are_drawn_and_marked_when_failed(key: str, plot: str, outcome: str,
                                                              text: str) -> None:
    threshold = float(text.split()[2])
    run = _run("dflash", Judgement(key=key, outcome=outcome, message="m", threshold=threshold))  # type: ignore[arg-type]
    svg = svg_plots(run)[plot]
    assert text in texts(svg)
    (line,) = [x for x in ET.fromstring(svg).iter(f"{NS}line") if x.get("class") == "dflash-threshold"]
    assert line.get("stroke") == ("#c62828" if outcome == "fail" else "#555")


def test_every_recorded_plot_keeps_its_text_inside() -> None:
    run = _run("dflash", Judgement(key="output_tok_s", outcome="fail", message="m", threshold=700.0))
    for name, svg in svg_plots(run).items():
        assert overflowing_texts(svg) == [], name


def test_readiness_labels_fit_for_long_host_names() -> None:
    long = "gpu-node-with-a-very-long-fully-qualified-name.rack-17.datacenter-west.example.internal"
    svg = readiness_spread_svg({"dflash": {"a": 2.1, "b": 2.4, long: 6.7},
                                "a-service-with-a-long-name-too-long-for-its-column": {"a": 1.0, long: 3.0}})
    assert svg is not None
    assert overflowing_texts(svg) == []
    # shortened after a whole word (a name's parts end at - or .), the whole name kept as the tooltip
    shown = next(t for t in texts(svg) if "max 6.7 s (gpu-node" in t)
    kept = shown.split("(", 1)[1].removesuffix("…)")
    assert shown.endswith("…)") and long.startswith(kept) and kept[-1] in "-.", shown
    assert long in svg  # the tooltip


def test_a_label_is_cut_after_a_word_or_wrapped_never_inside_one() -> None:
    """Before: "…FlashInfer cannot target this…9: >= 0.7.1 …" (the middle cut out, "nvcc too old" with it)."""
    from pytest_dflash.report.plots.canvas import fit_text, wrap_lines

    why = ("[flashinfer-sm12x-nvcc] FlashInfer cannot target this SM 12.x GPU: the CUDA toolkit (nvcc) its JIT "
           "uses is too old (<= 0.7.0: every SM 12.x needs >= 12.9; >= 0.7.1: SM 12.0 needs >= 12.8)")
    lines = wrap_lines(why, 600)
    assert " ".join(lines) == why and all(text_width(line) <= 600 for line in lines), lines
    assert fit_text("the run stopped before the additional checks", 150) == "the run stopped…"
    assert fit_text("additional", 30) == "…"
    svg = cold_start_timeline_svg({}, failed={"dflash": why},
                                  stopped={"dflash": {"http_s": 1.0, "greedy_s": 2.0, "total_s": 9.1}})
    assert svg is not None and overflowing_texts(svg) == []
    assert "(nvcc) its JIT uses is too old" in " ".join(texts(svg)), texts(svg)


def test_cold_start_labels_fit_for_long_service_names() -> None:
    svg = cold_start_timeline_svg({"x" * 60: {"http_s": 1.0, "greedy_s": 2.0, "sampled_s": 3.0, "total_s": 3.0}})
    assert svg is not None
    assert overflowing_texts(svg) == []


def test_a_service_that_never_became_ready_is_drawn_first_saying_where_it_stopped() -> None:
    ready = {"none": {"http_s": 1.0, "greedy_s": 2.0, "sampled_s": 3.0, "total_s": 3.0}}
    why = "ServiceCrashed: service dflash died during readiness: first sampled generation: killed by SIGKILL"
    svg = cold_start_timeline_svg(ready, failed={"dflash": why})
    assert svg is not None
    drawn = texts(svg)
    assert drawn.index("dflash") < drawn.index("none")
    assert drawn[drawn.index("never ready:") + 1] == why
    assert overflowing_texts(svg) == []
    longer = cold_start_timeline_svg(ready, failed={"dflash": why + ", " + " ".join(["its last log line"] * 8)})
    assert longer is not None
    lines = texts(longer)
    first = next(i for i, t in enumerate(lines) if t.startswith("ServiceCrashed"))
    said = " ".join(lines[first:first + 3])
    assert said == why + ", " + " ".join(["its last log line"] * 8), "wrapped whole, nothing cut"
    assert overflowing_texts(longer) == []
    alone = cold_start_timeline_svg({}, failed={"dflash": why})  # the host's only service died
    assert alone is not None and "never ready:" in texts(alone)


def test_a_service_that_never_became_ready_is_drawn_up_to_where_it_stopped() -> None:
    """The phases it finished, coloured as for a ready service; the time after them, until the wait failed,
    hatched red; the line under the bar says in which phase it stopped, after how long, and why."""
    ready = {"none": {"http_s": 1.0, "greedy_s": 2.0, "sampled_s": 3.0, "total_s": 3.0, "waited_from": 100.0}}
    stopped = {"dflash": {"http_s": 20.0, "greedy_s": 21.5, "sampled_s": None, "total_s": 41.0,
                          "waited_from": 102.0, "phases": {"weights_loaded": 12.0, "port_open": 20.0,
                                                           "first_greedy": 21.5}}}
    why = "ServiceCrashed: service dflash died during readiness: killed by SIGKILL"
    svg = cold_start_timeline_svg(ready, failed={"dflash": why}, stopped=stopped)
    assert svg is not None
    phases = re.findall(r'data-phase="([a-z_]+)"><title>dflash:', svg)
    assert phases == ["weights_loaded", "port_open", "first_greedy", "stopped"], phases
    assert "other" not in re.findall(r'data-phase="([a-z_]+)"><title>dflash', svg)
    drawn = texts(svg)
    assert "never ready (stopped in its first sampled request, after 41.0 s):" in drawn
    assert drawn[drawn.index("never ready (stopped in its first sampled request, after 41.0 s):") + 1] == why
    # one clock: the failed service's wait began 2 s after the other's, so its bar ends at 43 s, the axis's end
    ticks = [float(t) for t in texts(svg) if re.fullmatch(r"\d+(\.\d+)?", t)]
    assert max(ticks) >= 43.0, ticks
    assert overflowing_texts(svg) == []
    never_answered = cold_start_timeline_svg({}, failed={"dflash": why},
                                             stopped={"dflash": {"http_s": None, "total_s": 300.0}})
    assert never_answered is not None
    assert "never ready (stopped before its port opened, after 300.0 s):" in texts(never_answered)
