"""Output tokens/s over the run, per time bin, with the headline's mean and the floors judged on it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pytest_dflash.report.plots.canvas import HEIGHT, PALETTE, WIDTH, Canvas, Threshold, empty_plot, fmt


def tokens_over_time_svg(points: Sequence[tuple[float, float]], *, title: str = "Output tokens/s over time",
                         width: int = WIDTH, height: int = HEIGHT, headline: float | None = None,
                         partial: tuple[float, float] | None = None,
                         thresholds: Sequence[Threshold] = ()) -> str:
    """A line of (time s, tokens/s) points, e.g. from :func:`pytest_dflash.load.tokens_over_time`.

    `headline`: the run's output tok/s (all output tokens / the run's duration), drawn as the dashed mean, so
    the plot and the headline show one number (a mean of the bins would weigh a short last bin like a full
    one). `partial`: (seconds covered, bin seconds) of the last point when its bin was cut short by the end of
    the run: it is left out of the line and drawn as a hollow marker, labelled, not as a collapse.
    `thresholds`: the output tok/s floor(s) judged on the run."""
    pts = [(float(t), float(v)) for t, v in points if math.isfinite(t) and math.isfinite(v)]
    if not pts:
        return empty_plot(title, width, height, "no token timing data")
    last = pts.pop() if partial is not None and len(pts) > 1 else None
    lines = [t for t in thresholds if math.isfinite(t.value)]
    c = Canvas(title, "time since start (s)", "output tokens/s", width, height)
    xticks = c.set_x(min(t for t, _ in pts), max(t for t, _ in [*pts, *([last] if last else [])]))
    top = max([v for _, v in pts] + [t.value for t in lines] + [headline or 0.0])
    yticks = c.set_y(0.0, top * 1.12 or 1.0)
    c.axes(xticks, yticks)
    path = " ".join(f"{c.px(t):.1f},{c.py(v):.1f}" for t, v in pts)
    c.parts.append(f'<polyline fill="none" stroke="{PALETTE[0]}" stroke-width="1.5" points="{path}"/>')
    names, colours = ["tokens/s per bin"], [PALETTE[0]]
    if last is not None and partial is not None:
        covered, bin_s = partial
        c.parts.append(f'<circle cx="{c.px(last[0]):.1f}" cy="{c.py(last[1]):.1f}" r="3.5" fill="none" '
                       f'stroke="#999" class="dflash-partial-bin"><title>last bin: only {covered:.2f} s of '
                       f"{bin_s:.2f} s before the run ended ({fmt(last[1])} tok/s), not a slow-down"
                       "</title></circle>")
        names.append("○ last bin partial (not in the line)")
        colours.append("#999")
    if headline is not None and math.isfinite(headline):
        y = c.py(headline)
        c.parts.append(f'<line x1="{c.x0}" y1="{y:.1f}" x2="{c.x1}" y2="{y:.1f}" stroke="{PALETTE[1]}" '
                       f'stroke-dasharray="4 3" class="dflash-mean"/>')
        names.append(f"mean {headline:.1f} tok/s (the headline)")
        colours.append(PALETTE[1])
    for threshold in lines:
        c.hline(threshold.value, threshold)
    c.legend(names, colours)
    return c.svg()


