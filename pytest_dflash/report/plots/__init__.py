"""Performance and start-up plots as standalone SVG strings (hand-written SVG, no plotting dependency), one
plot a module:

* latency_cdf.py — empirical CDFs of latency series (TTFT, e2e …);
* tokens_over_time.py — output tokens/s over the run, per time bin;
* accept_length.py — per-request speculative accept lengths;
* for_result.py — the three for a :class:`~pytest_dflash.load.LoadResult`;
* cold_start.py — one host's services side by side on one clock, each bar cut into its start-up phases
  (phases.py: the phases of the verdict's `services[<svc>]["ready"]`);
* readiness_spread.py — each service's readiness seconds across the hosts of a fleet;
* sweep.py — a load sweep's curves (tok/s, TTFT / TPOT p99 over the SLO band, the speed-up and its
  crossover), from layers/perf/sweep's SweepCurve;
* canvas.py — what they share: axes, ticks, legends, thresholds, text fitted into its room.

Every function returns one ``<svg>`` element (valid XML, ``xmlns`` set, a ``<title>`` for screen readers) that
can be embedded in HTML as is or written to a ``.svg`` file. A label that does not fit is wrapped onto more
lines or shortened at a word's end (never inside a word), its whole text kept as its tooltip.
"""

from __future__ import annotations

from pytest_dflash.report.plots.accept_length import accept_length_histogram_svg
from pytest_dflash.report.plots.canvas import Threshold, text_width
from pytest_dflash.report.plots.cold_start import cold_start_timeline_svg, phase_legend_svg
from pytest_dflash.report.plots.for_result import plots_for_result
from pytest_dflash.report.plots.latency_cdf import latency_cdf_svg
from pytest_dflash.report.plots.phases import (
    cold_start_phases,
    phase_order,
    phase_style,
    stopped_in,
    stopped_phases,
)
from pytest_dflash.report.plots.readiness_spread import readiness_spread_svg
from pytest_dflash.report.plots.tokens_over_time import tokens_over_time_svg

__all__ = ["Threshold", "accept_length_histogram_svg", "cold_start_phases", "cold_start_timeline_svg",
           "latency_cdf_svg", "phase_legend_svg", "phase_order", "phase_style", "plots_for_result",
           "readiness_spread_svg", "stopped_in", "stopped_phases", "text_width", "tokens_over_time_svg"]
