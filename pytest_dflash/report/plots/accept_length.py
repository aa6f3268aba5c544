"""A histogram of per-request speculative accept lengths, with the run's accept length and its floor."""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape

from pytest_dflash.report.plots.canvas import HEIGHT, PALETTE, WIDTH, Canvas, Threshold, empty_plot, fmt


def accept_length_histogram_svg(values: Sequence[float], *, title: str = "Accept length per request",
                                bins: int | None = None, width: int = WIDTH, height: int = HEIGHT,
                                mean: float | None = None, thresholds: Sequence[Threshold] = ()) -> str:
    """Histogram of per-request accept lengths (tokens per verify step).

    `mean`: the run's accept length as its headline states it (Σ output tokens / Σ verify steps, which weighs
    a long request more than the plain mean of the per-request values does), drawn as a vertical line; the
    plain mean of `values` when not given. `thresholds`: the accept-length floor judged on the run."""
    vals = [float(v) for v in values if math.isfinite(v)]
    if not vals:
        return empty_plot(title, width, height,
                          "no accept-length data (native /generate with speculation only)")
    lines = [t for t in thresholds if math.isfinite(t.value)]
    lo, hi = min(vals), max(vals)
    if bins is None:
        bins = max(1, min(30, int(math.sqrt(len(vals))) + 1))
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
    counts = [0] * bins
    for v in vals:
        counts[min(int((v - lo) / (hi - lo) * bins), bins - 1)] += 1
    c = Canvas(title, "accept length (tokens per verify step)", "requests", width, height)
    xticks = c.set_x(min([lo] + [t.value for t in lines]), max([hi] + [t.value for t in lines]))
    yticks = c.set_y(0.0, max(counts) * 1.25)
    c.axes(xticks, yticks)
    for i, n in enumerate(counts):
        x1, x2 = c.px(edges[i]), c.px(edges[i + 1])
        y = c.py(n)
        c.parts.append(f'<rect x="{x1 + 0.5:.1f}" y="{y:.1f}" width="{max(x2 - x1 - 1, 0.5):.1f}" '
                       f'height="{c.y0 - y:.1f}" fill="{PALETTE[2]}"><title>{escape(fmt(edges[i]))}–'
                       f'{escape(fmt(edges[i + 1]))}: {n}</title></rect>')
    weighted = mean is not None and math.isfinite(mean)
    shown = mean if mean is not None and weighted else sum(vals) / len(vals)
    x = c.px(shown)
    c.parts.append(f'<line x1="{x:.1f}" y1="{c.y0}" x2="{x:.1f}" y2="{c.y1}" stroke="{PALETTE[1]}" '
                   f'stroke-dasharray="4 3" class="dflash-mean"/>')
    how = " (Σ tokens / Σ verify steps)" if weighted else ""
    c.legend([f"n={len(vals)} requests", f"accept length {shown:.3f}{how}"], colors=[PALETTE[2], PALETTE[1]])
    for row, threshold in enumerate(lines):
        c.vline(threshold.value, threshold, row=row + 2)
    return c.svg()


