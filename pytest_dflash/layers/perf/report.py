"""The perf layer's report side: each test's "dflash perf" section and HTML block (judgements, plots), and the
terminal summary of every service's latest run (controller side, also under xdist).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from pytest_dflash.config.tables.floors import LATENCY_FLOOR
from pytest_dflash.layers.perf.judgement import Judgement
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.report.perf_table import perf_table, rows_from_metrics
from pytest_dflash.report.plots import Threshold, plots_for_result

__all__ = ["PerfSummary", "html_block", "plot_thresholds", "runs_table", "section_text", "summary_lines",
           "svg_plots"]


def section_text(runs: Sequence[ServiceRun], judgements: Sequence[tuple[ServiceRun, Judgement]]) -> str:
    """A test's "dflash perf" report section: each run's headline, refusal and the judgements the
    test made."""
    text = []
    for run in runs:
        text.append(run.headline())
        if run.refusal:
            text.append(f"  REFUSED: {run.refusal}")
        text += [f"  {j.message}" for r, j in judgements if r is run]
    return "\n".join(text)


def plot_thresholds(run: ServiceRun) -> list[Threshold]:
    """The floors and ceilings judged on `run`, for its plots: output tok/s and accept length (floors), TTFT
    and end-to-end latency ceilings (the ITL / TPOT ones have no plot); a failed one is marked."""
    out = []
    for key, judgement in run.judgements.items():
        if judgement.threshold is None or not math.isfinite(judgement.threshold):
            continue
        failed = judgement.outcome == "fail"
        if key in ("output_tok_s", "accept_length"):
            out.append(Threshold(label=key, value=judgement.threshold, kind="floor", failed=failed,
                                 series=key))
        elif (latency := LATENCY_FLOOR.match(key)) and latency.group(1) in ("ttft", "e2e"):
            out.append(Threshold(label=key, value=judgement.threshold, kind="ceiling", failed=failed,
                                 series="TTFT" if latency.group(1) == "ttft" else "e2e"))
    return out


def svg_plots(run: ServiceRun) -> dict[str, str]:
    """Latency CDF, tokens/s over time and (speculative services) the accept-length histogram, as SVG, with
    the floors and ceilings judged on the run, each mean the headline's number."""
    svgs = plots_for_result(run.result, accept_length=run.accept_length, thresholds=plot_thresholds(run))
    if run.accept_length is None:
        svgs.pop("accept_length", None)  # NONE, or no native API: nothing to draw
    return svgs


def runs_table(runs: Sequence[ServiceRun]) -> str:
    """The test's services in one table (output tok/s, req/s, TTFT / ITL / e2e p50 and p99, the client's and
    the server's accept length, speed-up)."""
    rows = [row for run in runs
            for row in rows_from_metrics(run.host, run.metrics(), {run.service: run.algorithm},
                                         failing=any(j.outcome == "fail" for j in run.judgements.values()))]
    return perf_table(rows, hosts=len({run.host for run in runs}) > 1)


def html_block(run: ServiceRun, *, plots: bool) -> str:
    colour = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#ef6c00", "refused": "#6a1b9a"}
    rows = "".join(
        f'<tr><td style="color:{colour[j.outcome]};font-weight:bold">{j.outcome}</td>'
        f"<td>{html.escape(j.message)}</td></tr>" for j in run.judgements.values())
    out = [f'<div class="dflash-perf" style="margin:6px 0"><b>{html.escape(run.headline())}</b>']
    if rows:
        out.append(f'<table class="dflash-perf-judgements">{rows}</table>')
    if plots:
        svgs = svg_plots(run)
        out.append('<div style="display:flex;flex-wrap:wrap;gap:8px">' + "".join(svgs.values()) + "</div>")
    out.append("</div>")
    return "".join(out)


class PerfSummary:
    """Controller side (also under xdist): the latest summary of each service's perf run, for the terminal."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, str], dict[str, Any]] = {}
        self.sweep_lines: list[str] = []  # each host's load sweep (layers/perf/sweep/), a line per curve

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == "dflash_sweep" and isinstance(value, list):
                self.sweep_lines += [str(v) for v in value if str(v) not in self.sweep_lines]
            if key == "dflash_perf" and isinstance(value, list):
                for summary in value:
                    if isinstance(summary, dict):
                        self.latest[(str(summary["host"]), str(summary["service"]))] = summary

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.sweep_lines:
            terminalreporter.section("dflash sweep")
            for line in self.sweep_lines:
                terminalreporter.write_line(line)
        if not self.latest:
            return
        terminalreporter.section("dflash perf")
        for line in summary_lines(self.latest.values()):
            terminalreporter.write_line(line)


def summary_lines(summaries: Iterable[Mapping[str, Any]]) -> list[str]:
    """Per host: each service's numbers, then its judgements, then the speed-ups at the same load."""
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for summary in summaries:
        by_host.setdefault(str(summary["host"]), []).append(summary)
    lines: list[str] = []
    for host, services in sorted(by_host.items()):
        loads = sorted({str(s["describe"]) for s in services})
        lines.append(f"{host}: {'; '.join(loads)}")
        for s in services:
            bounds = ""
            if isinstance(s.get("lower"), int | float) and math.isfinite(s["lower"]):
                bounds = f" [{s['lower']:.1f}, {s['upper']:.1f}]"
            parts = [f"{s['output_tok_s']:.1f} tok/s{bounds}"]
            if isinstance(s.get("request_throughput"), int | float):
                parts.append(f"{s['request_throughput']:.2f} req/s")
            if s.get("p99_ttft_ms") is not None:
                parts.append(f"TTFT p50/p99 {s['median_ttft_ms']:.1f}/{s['p99_ttft_ms']:.1f} ms")
            if s.get("p99_itl_ms") is not None:
                parts.append(f"ITL p99 {s['p99_itl_ms']:.1f} ms")
            if s.get("p99_e2e_latency_ms") is not None and s.get("median_e2e_latency_ms") is not None:
                parts.append(f"e2e p50/p99 {s['median_e2e_latency_ms']:.1f}/{s['p99_e2e_latency_ms']:.1f} ms")
            if s.get("accept_length") is not None:
                server = s.get("server_accept_length")
                parts.append(f"accept length {s['accept_length']:.2f} (client"
                             + (f"; server-reported {server:.2f})" if server is not None else ")"))
            by_category = s.get("accept_length_by_category") or {}
            if by_category:
                parts.append("per category " + ", ".join(f"{k} {v:.2f}" for k, v in by_category.items()))
            if s.get("failed"):
                parts.append(f"{s['failed']} failed requests")
            if s.get("saturated"):
                parts.append("CLIENT SATURATED")
            lines.append(f"    {s['service']} ({s['algorithm']}): {', '.join(parts)}")
            outcomes = s.get("outcomes") or {}
            judged = ", ".join(f"{k} {'PASS' if v == 'pass' else v.upper()}" for k, v in outcomes.items())
            if judged:
                lines.append(f"        {judged}")
        speedups = [c for s in services for c in s.get("comparisons") or []]
        if speedups:
            lines.append("    speed-up (output tok/s, same load, 95% bounds): " + "; ".join(speedups))
    return lines
