"""A load sweep's pictures (report/plots/sweep.py) and the HTML report's sweep section (report/sweep_section.py),
drawn from a curve recorded against real refservers (tests/data/refserver-sweep-curve/sweep.json: NONE and
DFLASH at concurrency 1, 4, 8, level 16 left unrun by the budget; DFLASH slower than NONE from 8; SLOs TTFT p99
<= 100 ms, TPOT p99 <= 10 ms that level 8 breaks)."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.svgtext import overflowing_texts

from pytest_dflash.layers.perf.sweep.build import curve_from_files
from pytest_dflash.load.curve import SweepCurve
from pytest_dflash.report.plots.sweep import (
    not_run_label,
    sweep_latency_svg,
    sweep_plots,
    sweep_speedup_svg,
    sweep_throughput_svg,
)
from pytest_dflash.report.sweep_section import sweep_section

DATA = Path(__file__).parents[1] / "data" / "refserver-sweep-curve" / "sweep.json"
NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def curve() -> SweepCurve:
    return SweepCurve.from_json(DATA.read_text())


def _svg(text: str) -> ET.Element:
    root = ET.fromstring(text)  # valid XML, embeddable as is
    assert root.tag == f"{NS}svg"
    return root


def _groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def _text(element: ET.Element) -> str:
    """The text an element shows (its <title> tooltip left out)."""
    return " ".join(t.text or "" for t in element.iter(f"{NS}text"))


def _tips(element: ET.Element) -> str:
    return " ".join(t.text or "" for t in element.iter(f"{NS}title"))


def test_throughput_has_an_error_bar_per_measured_point_and_marks_the_unrun_level(curve: SweepCurve) -> None:
    root = _svg(sweep_throughput_svg(curve))
    bars = _groups(root, "dflash-error-bar")
    assert len(bars) == 6  # 2 services x 3 measured levels, each with its bounds
    assert "dflash at concurrency 8: 598 tok/s [562, 635.9]" in _tips(root)
    not_run = _groups(root, "dflash-not-run")
    assert [g.get("data-level") for g in not_run] == ["16"]
    assert _text(not_run[0]) == "not run: budget"
    assert "not run: sweep_budget 2m spent" in _tips(not_run[0])
    assert len(_groups(root, "dflash-point")) == 6  # nothing drawn at the unrun level
    assert "output tokens/s" in _text(root) and "log2 scale" in _text(root)
    assert "dflash (DFLASH)" in _text(root) and "none (NONE)" in _text(root)  # the legend


def test_latency_shades_the_slo_band_draws_the_ceiling_and_crosses_the_points_that_broke_it(
        curve: SweepCurve) -> None:
    root = _svg(sweep_latency_svg(curve, "tpot_p99_ms"))
    band = _groups(root, "dflash-slo-band")
    assert len(band) == 1 and float(band[0].get("height") or 0) > 0
    ceiling = _groups(root, "dflash-slo-ceiling")
    assert len(ceiling) == 1 and _text(ceiling[0]) == "SLO TPOT p99 ≤ 10 ms: broken"
    broken = _groups(root, "dflash-slo-broken")
    # the TPOT checks that failed: dflash at 4 and 8, none at 8 (an inconclusive check is not drawn as broken)
    assert sorted(_tips(g).split(":")[0] for g in broken) == ["dflash at concurrency 4", "dflash at concurrency 8",
                                                             "none at concurrency 8"]
    assert len(_groups(root, "dflash-point")) == 3
    assert "TPOT p99 (ms)" in _text(root) and "× broke the SLO" in _text(root)
    ttft = _svg(sweep_latency_svg(curve, "ttft_p99_ms"))
    assert [_tips(g).split(":")[0] for g in _groups(ttft, "dflash-slo-broken")] == ["none at concurrency 8"]


def test_a_ceiling_far_above_every_point_is_said_not_drawn_to_scale(curve: SweepCurve) -> None:
    """An SLO of 5 s over p99s of 10-100 ms: the axis stays on the points (before: stretched to 5000, every
    point flat on the axis), the band fills the plot, the ceiling is labelled as above this scale."""
    loose = dataclasses.replace(curve, slo={"ttft_p99_ms": 5000.0}, services=tuple(
        dataclasses.replace(s, slo={"ttft_p99_ms": 5000.0}) for s in curve.services))
    root = _svg(sweep_latency_svg(loose, "ttft_p99_ms"))
    ticks = [float(t.text or "0") for t in root.iter(f"{NS}text") if (t.get("text-anchor") == "end"
                                                                       and (t.text or "").isdigit())]
    assert max(ticks) < 1000, ticks
    (ceiling,) = _groups(root, "dflash-slo-ceiling")
    assert _text(ceiling).startswith("SLO TTFT p99 ≤ 5000 ms") and _text(ceiling).endswith("(above this scale)")
    assert not list(ceiling.iter(f"{NS}line"))


def test_a_p90_slo_is_drawn_over_the_p90s_and_e2e_gets_its_picture() -> None:
    """hosts/local.toml judges p90s (30 requests bound a p90 above, a p99 needs 299): the TTFT picture is
    the p90 its SLO judges, with its band (before: the p99s, no band, the SLO nowhere), e2e gets one because an
    SLO judges it, TPOT stays at p99 without a band."""
    curve = curve_from_files((DATA.parents[1] / "refserver-sweep").glob("*.json"), host="refserver",
                             slo={"ttft_p90_ms": 30.0, "e2e_p90_ms": 300.0})
    plots = sweep_plots(curve)
    assert list(plots) == ["throughput", "ttft_p90_ms", "tpot_p99_ms", "e2e_p90_ms", "speedup:dflash:none"]
    ttft = _svg(plots["ttft_p90_ms"])
    assert "TTFT p90 (ms)" in _text(ttft) and len(_groups(ttft, "dflash-slo-band")) == 1
    assert _text(_groups(ttft, "dflash-slo-ceiling")[0]) == "SLO TTFT p90 ≤ 30 ms: broken"
    assert [_tips(g).split(":")[0] for g in _groups(ttft, "dflash-slo-broken")] == ["dflash at concurrency 8"]
    assert len(_groups(ttft, "dflash-error-bar")) == 6  # each p90 with its bounds, from its SLO check
    assert not _groups(_svg(plots["tpot_p99_ms"]), "dflash-slo-band")
    e2e = _svg(plots["e2e_p90_ms"])
    assert _groups(e2e, "dflash-slo-band") and "e2e p90 (ms)" in _text(e2e)


def test_latency_without_an_slo_has_no_band(curve: SweepCurve) -> None:
    bare = dataclasses.replace(curve, slo={}, services=tuple(dataclasses.replace(s, slo={})
                                                             for s in curve.services))
    root = _svg(sweep_latency_svg(bare, "ttft_p99_ms"))
    assert not _groups(root, "dflash-slo-band") and not _groups(root, "dflash-slo-ceiling")


def test_speedup_draws_the_1x_line_and_labels_the_crossover(curve: SweepCurve) -> None:
    (speedup,) = curve.speedups
    root = _svg(sweep_speedup_svg(curve, speedup))
    assert len(_groups(root, "dflash-error-bar")) == 3
    assert _text(_groups(root, "dflash-one-x")[0]) == "1× = as fast as none"
    crossover = _groups(root, "dflash-crossover")
    assert len(crossover) == 1 and crossover[0].get("data-level") == "8"
    assert _text(crossover[0]) == "slower than none from concurrency 8"
    assert "95% upper bound 0.85x" in _tips(crossover[0])
    assert [g.get("data-level") for g in _groups(root, "dflash-not-run")] == ["16"]
    paying = dataclasses.replace(speedup, crossover=None, crossover_text=None)
    root = _svg(sweep_speedup_svg(curve, paying))
    assert not _groups(root, "dflash-crossover")
    assert _text(_groups(root, "dflash-no-crossover")[0]) == "no crossover up to concurrency 8"


def test_every_sweep_picture_keeps_its_text_inside_even_with_long_names(curve: SweepCurve) -> None:
    long = "dflash-qwen3-8b-block16-with-cuda-graphs-on-a-very-long-service-name"
    host = "gpu-node-with-a-very-long-fully-qualified-name.rack-17.datacenter-west.example.internal"
    renamed = dataclasses.replace(
        curve, host=host,
        services=tuple(dataclasses.replace(s, service=long if s.service == "dflash" else s.service)
                       for s in curve.services),
        speedups=tuple(dataclasses.replace(s, service=long) for s in curve.speedups))
    for which in (curve, renamed):
        for name, svg in sweep_plots(which).items():
            assert overflowing_texts(svg) == [], name


def test_sweep_plots_names_every_picture(curve: SweepCurve) -> None:
    assert list(sweep_plots(curve)) == ["throughput", "ttft_p99_ms", "tpot_p99_ms", "speedup:dflash:none"]


@pytest.mark.parametrize(("why", "label"), [
    ("not run: sweep_budget 2m spent", "not run: budget"),
    ("not run: early stop: concurrency 16 broke its SLOs twice", "not run: early stop"),
    ("not run: dflash is not ready (connection refused)", "not run: not ready"),
    (None, "not run"),
])
def test_a_not_run_level_says_why_in_short(why: str | None, label: str) -> None:
    assert not_run_label(why) == label


def test_the_report_section_draws_each_host_that_swept_in_this_run(curve: SweepCurve, tmp_path: Path) -> None:
    (tmp_path / "perf" / "refserver").mkdir(parents=True)
    (tmp_path / "perf" / "refserver" / "sweep.json").write_text(curve.to_json())
    swept = {"perf.dflash.sweep.c1.output_tok_s": 309.4}
    page = sweep_section(tmp_path, {"refserver": swept, "other": {"perf.dflash.output_throughput": 1.0}})
    assert page.startswith("<h2>dflash load sweep</h2>")
    assert page.count('class="dflash-sweep"') == 1 and 'data-host="refserver"' in page
    assert ("crossover: dflash (DFLASH) is slower than none from concurrency 8 (0.78x, 95% upper bound 0.85x)"
            in page)
    # its first level's p99s have no finite upper bound (30 requests): not a pass, and not said to be broken
    assert ("dflash: no level confidently within the SLOs; concurrency 1 inconclusive (the SLOs not confidently "
            "met)") in page
    assert page.count("<svg") == 4
    # a sweep.json an earlier run left behind is not this run's picture
    assert sweep_section(tmp_path, {"refserver": {"perf.dflash.output_throughput": 1.0}}) == ""
    (tmp_path / "perf" / "refserver" / "sweep.json").write_text("{")
    assert "could not draw the sweep: sweep.json" in sweep_section(tmp_path, {"refserver": swept})
