"""SVG plots: valid XML, labelled axes, ticks inside the data range."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np

from pytest_dflash.load import LoadResult, LoadSpec, RequestRecord, Saturation, aggregate
from pytest_dflash.report.plots import (
    accept_length_histogram_svg,
    latency_cdf_svg,
    plots_for_result,
    tokens_over_time_svg,
)

NS = "{http://www.w3.org/2000/svg}"


def _texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    assert root.find(f"{NS}title") is not None
    return [t.text or "" for t in root.iter(f"{NS}text")]


def test_latency_cdf_is_valid_svg_with_axes_and_legend() -> None:
    rng = np.random.default_rng(0)
    svg = latency_cdf_svg({"TTFT": list(rng.normal(50, 2, 200)), "e2e <ms> & co": list(rng.normal(1300, 30, 200))})
    texts = _texts(svg)  # the ampersand and brackets in a name are escaped
    assert "latency (ms) (log scale)" in texts
    assert "fraction of requests" in texts
    assert any(t.startswith("TTFT p50 ") for t in texts)
    assert "1" in texts and "0" in texts  # y ticks 0 .. 1
    assert "100" in texts and "1000" in texts  # log ticks
    root = ET.fromstring(svg)
    assert len(root.findall(f"{NS}polyline")) == 2


def test_linear_axis_when_values_are_close() -> None:
    texts = _texts(latency_cdf_svg({"TTFT": [50.1, 50.4, 51.0, 52.2]}))
    assert "latency (ms)" in texts
    assert any(t in texts for t in ("50", "50.5", "51", "52"))


def test_tokens_over_time() -> None:
    svg = tokens_over_time_svg([(0.0, 700.0), (1.0, 780.0), (2.0, 775.0), (3.0, 300.0)], headline=640.0)
    texts = _texts(svg)
    assert "time since start (s)" in texts and "output tokens/s" in texts
    assert "mean 640.0 tok/s (the headline)" in texts


def test_accept_length_histogram() -> None:
    svg = accept_length_histogram_svg([1.0, 1.5, 2.0, 2.0, 3.5, 4.2])
    root = ET.fromstring(svg)
    labels = [t.text or "" for r in root.iter(f"{NS}rect") if (t := r.find(f"{NS}title")) is not None]
    assert sum(int(label.rsplit(": ", 1)[1]) for label in labels) == 6
    assert "accept length (tokens per verify step)" in _texts(svg)
    # one distinct value still draws
    ET.fromstring(accept_length_histogram_svg([2.0, 2.0]))


def test_empty_inputs_still_give_valid_svg() -> None:
    assert "no successful requests" in _texts(latency_cdf_svg({"TTFT": []}))
    assert any("accept-length" in t for t in _texts(accept_length_histogram_svg([])))
    ET.fromstring(tokens_over_time_svg([]))


def test_plots_for_a_load_result() -> None:
    recs = [RequestRecord(index=i, start_s=i * 0.2, end_s=i * 0.2 + 1.0, ttft_ms=50.0 + i, e2e_ms=1000.0,
                          itl_ms=[10.0] * 9, output_tokens=10, prompt_tokens=5, verify_ct=4,
                          accept_length=2.5, token_times_s=[i * 0.2 + 0.05 + 0.1 * k for k in range(10)])
            for i in range(20)]
    metrics, errors = aggregate(recs, max_concurrency=5)
    result = LoadResult(spec=LoadSpec(endpoint="generate", num_requests=20), base_url="http://x", records=recs,
                        metrics=metrics, errors_by_kind=errors, saturation=Saturation())
    plots = plots_for_result(result)
    assert set(plots) == {"latency_cdf", "tokens_over_time", "accept_length"}
    for svg in plots.values():
        ET.fromstring(svg)
