"""Empirical CDFs of latency series (TTFT, e2e …), a log x axis when the values span more than a decade and
a half, each ceiling judged on them as a vertical line."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pytest_dflash.report.plots.canvas import HEIGHT, PALETTE, WIDTH, Canvas, Threshold, empty_plot, fmt


def latency_cdf_svg(series: Mapping[str, Sequence[float]], *, title: str = "Latency CDF",
                    xlabel: str = "latency (ms)", log_x: bool | None = None, width: int = WIDTH,
                    height: int = HEIGHT, thresholds: Sequence[Threshold] = ()) -> str:
    """Empirical CDFs (step lines) of one or more latency series, with p50/p99 in the legend and each ceiling
    judged on them as a vertical line (the axis stretched to show it)."""
    data = {k: sorted(float(v) for v in vs if math.isfinite(v)) for k, vs in series.items()}
    data = {k: v for k, v in data.items() if v}
    if not data:
        return empty_plot(title, width, height, "no successful requests")
    lines = [t for t in thresholds if math.isfinite(t.value) and t.value > 0]
    lo = min(v[0] for v in data.values())
    hi = max([v[-1] for v in data.values()] + [t.value for t in lines])
    if log_x is None:
        log_x = lo > 0 and hi / lo > 30
    if log_x and lo <= 0:
        log_x = False
    c = Canvas(title, xlabel + (" (log scale)" if log_x else ""), "fraction of requests", width, height)
    xticks = c.set_x(lo, hi, log=log_x)
    yticks = c.set_y(0.0, 1.0)
    c.axes(xticks, yticks)
    names = []
    for i, (name, vals) in enumerate(data.items()):
        n = len(vals)
        pts = [f"{c.px(vals[0]):.1f},{c.py(0.0):.1f}"]
        for j, v in enumerate(vals):
            x = c.px(v)
            pts.append(f"{x:.1f},{c.py(j / n):.1f}")
            pts.append(f"{x:.1f},{c.py((j + 1) / n):.1f}")
        color = PALETTE[i % len(PALETTE)]
        c.parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                       f'points="{" ".join(pts)}"/>')
        p50 = vals[min(n - 1, int(0.5 * n))]
        p99 = vals[min(n - 1, int(0.99 * n))]
        names.append(f"{name} p50 {fmt(p50)} p99 {fmt(p99)}")
    c.legend(names)
    for row, threshold in enumerate(lines):
        c.vline(threshold.value, threshold, row=row + 2)
    return c.svg()


