"""The cold-start timeline and the fleet's readiness spread: valid SVG, phases in order and coloured, from the
verdict's ready facts (with `phases`, or only http/greedy/sampled), on one clock per host."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from pytest_dflash.report.plots import cold_start_phases, cold_start_timeline_svg, readiness_spread_svg

NS = "{http://www.w3.org/2000/svg}"
DATA = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-ddtree" / "run2-accept" / "h200.verdict.json"


def _bars(svg: str) -> list[tuple[str, float, float, str]]:
    """(phase, x, width, tooltip) of every phase rectangle."""
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg" and root.find(f"{NS}title") is not None
    return [(r.get("data-phase") or "", float(r.get("x") or 0), float(r.get("width") or 0),
             (r.findtext(f"{NS}title") or "")) for r in root.iter(f"{NS}rect") if r.get("data-phase")]


def test_phases_from_the_log_lines_when_the_service_reported_them() -> None:
    ready = {"total_s": 248.7, "http_s": 33.2, "greedy_s": 120.0, "sampled_s": 248.7, "waited_from": 1000.0,
             "phases": {"process_started": 1.0, "weights_loaded": 30.0, "kv_cache_allocated": 33.0,
                        "port_open": 33.2, "cuda_graphs_captured": 90.0, "first_greedy": 120.0,
                        "first_sampled": 248.7}}
    assert cold_start_phases(ready) == [
        ("process_started", 0.0, 1.0), ("weights_loaded", 1.0, 30.0), ("kv_cache_allocated", 30.0, 33.0),
        ("port_open", 33.0, 33.2), ("cuda_graphs_captured", 33.2, 90.0), ("first_greedy", 90.0, 120.0),
        ("first_sampled", 120.0, 248.7)], "in the order they ended (graphs captured after the port opened)"


def test_phases_the_service_did_not_log_come_from_the_readiness_times() -> None:
    ready = {"http_s": 33.5, "greedy_s": 40.0, "sampled_s": 130.0, "total_s": 130.0,
             "phases": {"weights_loaded": 30.0, "kv_cache_allocated": 33.0}}
    assert cold_start_phases(ready) == [("weights_loaded", 0.0, 30.0), ("kv_cache_allocated", 30.0, 33.0),
                                        ("port_open", 33.0, 33.5), ("first_greedy", 33.5, 40.0),
                                        ("first_sampled", 40.0, 130.0)]


def test_without_phases_the_http_greedy_sampled_times_draw_the_bar() -> None:
    ready = {"http_s": 49.2, "greedy_s": 156.7, "sampled_s": 247.6, "total_s": 250.0}
    assert cold_start_phases(ready) == [("port_open", 0.0, 49.2), ("first_greedy", 49.2, 156.7),
                                        ("first_sampled", 156.7, 247.6), ("other", 247.6, 250.0)]
    assert cold_start_phases({"http_s": None, "notes": []}) == []


def test_services_side_by_side_on_one_clock() -> None:
    """Two services on one GPU: the second one's wait began 33 s after the first's; its bar starts there."""
    first = {"waited_from": 1000.0, "total_s": 248.7, "phases": {"kv_cache_allocated": 33.0, "first_sampled": 248.7}}
    second = {"waited_from": 1033.0, "total_s": 60.0, "http_s": 20.0, "greedy_s": 30.0, "sampled_s": 60.0}
    svg = cold_start_timeline_svg({"plain": first, "ngram <a&b>": second}, title="h200: cold start")
    assert svg is not None
    bars = _bars(svg)
    assert [b[0] for b in bars] == ["kv_cache_allocated", "first_sampled", "port_open", "first_greedy",
                                    "first_sampled"]
    plain_alloc, ngram_start = bars[0], bars[2]
    assert abs((plain_alloc[1] + plain_alloc[2]) - ngram_start[1]) < 1.0, "the second starts at the first's allocation"
    assert "plain: allocating KV cache 0.0–33.0 s (33.0 s)" in bars[0][3]
    texts = [t.text or "" for t in ET.fromstring(svg).iter(f"{NS}text")]
    assert "ngram <a&b>" in texts and "248.7 s" in texts and "allocating KV cache" in texts
    colours = {r.get("data-phase"): r.get("fill") for r in ET.fromstring(svg).iter(f"{NS}rect") if r.get("data-phase")}
    assert len(set(colours.values())) == len(colours), "each phase its own colour"


def test_a_recorded_h200_verdict_draws_every_ready_service() -> None:
    services = json.loads(DATA.read_text())["services"]
    ready = {name: facts["ready"] for name, facts in services.items()}
    svg = cold_start_timeline_svg(ready)
    assert svg is not None
    assert sum(1 for phase, *_ in _bars(svg) if phase == "first_sampled") == len(ready)


def test_nothing_to_draw_is_none() -> None:
    assert cold_start_timeline_svg({}) is None
    assert cold_start_timeline_svg({"dflash": {"notes": []}}) is None
    assert readiness_spread_svg({"dflash": {}}) is None


def test_readiness_spread_across_hosts() -> None:
    spread = {"dflash": {f"gpu-{i:02d}": 40.0 + i for i in range(9)} | {"gpu-17": 250.0},
              "plain": {"gpu-00": 30.0}}
    svg = readiness_spread_svg(spread)
    assert svg is not None
    root = ET.fromstring(svg)
    dots = [c.findtext(f"{NS}title") for c in root.iter(f"{NS}circle")]
    assert len(dots) == 11 and "gpu-17: 250.0 s" in dots
    texts = [t.text or "" for t in root.iter(f"{NS}text")]
    assert "10 hosts: min 40, median 44.5, max 250 s (gpu-17)" in texts
    assert "1 host: min 30, median 30, max 30 s (gpu-00)" in texts


def test_the_phases_as_columns_of_the_recorded_h200_overlap() -> None:
    """The HTML report's table under the timeline, on the H200 recording of plain + NGRAM on one GPU: one row per
    service, each phase's duration in its column (plain's 112 s CUDA-graph capture; NGRAM ran without graphs,
    so its cell is blank), ready after 280.1 s and 217.2 s; parses as XML."""
    from pytest_dflash.report.html import cold_start_table

    overlap = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-overlap" / "cold.verdict.json"
    services = json.loads(overlap.read_text())["services"]
    table = ET.fromstring(cold_start_table({name: facts["ready"] for name, facts in services.items()}))
    header, *rows = [[cell.text or "" for cell in row] for row in table.iter("tr")]
    assert header[0] == "service" and header[-1] == "ready after" and "capturing CUDA graphs" in header
    by_service = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert by_service["plain"]["capturing CUDA graphs"] == "112.0 s"
    assert by_service["ngram"]["capturing CUDA graphs"] == ""
    assert by_service["plain"]["ready after"] == "280.1 s" and by_service["ngram"]["ready after"] == "217.2 s"
