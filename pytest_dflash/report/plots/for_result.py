"""The three plots of one load run, each showing the number its headline states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pytest_dflash.report.plots.accept_length import accept_length_histogram_svg
from pytest_dflash.report.plots.canvas import Threshold
from pytest_dflash.report.plots.latency_cdf import latency_cdf_svg
from pytest_dflash.report.plots.tokens_over_time import tokens_over_time_svg

if TYPE_CHECKING:
    from pytest_dflash.load import LoadResult


def plots_for_result(result: LoadResult, *, bin_s: float | None = None, accept_length: float | None = None,
                     thresholds: Sequence[Threshold] = ()) -> dict[str, str]:
    """``{"latency_cdf", "tokens_over_time", "accept_length"}`` SVGs for one load run, each mean the number
    its headline states (`accept_length`: the run's, Σ tokens / Σ verify steps). `thresholds` are sorted onto
    their plot by label: "output_tok_s" (tokens/s), "accept_length", and the latency ceilings ("ttft_…",
    "e2e_…", drawn on the CDF of their series)."""
    from pytest_dflash.load import tokens_over_time

    ok = result.successful
    duration = float(result.metrics.get("duration") or 0.0)
    if bin_s is None:
        bin_s = max(0.1, duration / 60) if duration > 0 else 1.0
    points = tokens_over_time(ok, bin_s=bin_s)
    partial = None
    ends = [t for r in ok if not r.warmup for t in (r.token_times_s or [r.end_s or 0.0])]
    if points and ends:
        covered = max(ends) - points[-1][0]
        if covered < bin_s * 0.999:
            partial = (covered, bin_s)
    headline = result.metrics.get("output_throughput")
    cdf = [t for t in thresholds if t.series in ("TTFT", "e2e")]
    return {
        "latency_cdf": latency_cdf_svg({"TTFT": [r.ttft_ms for r in ok if r.ttft_ms is not None],
                                        "e2e": [r.e2e_ms for r in ok if r.e2e_ms is not None]},
                                       title="Latency CDF (TTFT, end to end)", thresholds=cdf),
        "tokens_over_time": tokens_over_time_svg(
            points, partial=partial, headline=float(headline) if isinstance(headline, int | float) else None,
            thresholds=[t for t in thresholds if t.series == "output_tok_s"]),
        "accept_length": accept_length_histogram_svg(
            [r.accept_length for r in ok if r.accept_length is not None], mean=accept_length,
            thresholds=[t for t in thresholds if t.series == "accept_length"]),
    }
