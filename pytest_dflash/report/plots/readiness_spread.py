"""Each service's readiness seconds across the hosts of a fleet: a dot per host, the median marked."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape

from pytest_dflash.report.plots.canvas import (
    PALETTE,
    Canvas,
    fit_text,
    fmt,
    linear_ticks,
    log_ticks,
    svg_label,
    text_width,
    vertical_grid,
)


def readiness_spread_svg(ready_s: Mapping[str, Mapping[str, float]], *, title: str = "Readiness across hosts",
                         width: int = 900) -> str | None:
    """Each service's readiness seconds across hosts: one row per service, a dot per host (tooltip: host and
    seconds), the median marked, min / median / max written beside it. `ready_s`: {service: {host: seconds}};
    a log axis when the values span more than 30x. None when there is nothing to draw."""
    rows = {name: {h: float(v) for h, v in hosts.items() if math.isfinite(v) and v >= 0}
            for name, hosts in ready_s.items()}
    rows = {name: hosts for name, hosts in rows.items() if hosts}
    if not rows:
        return None
    summaries = {name: spread_summary(hosts) for name, hosts in rows.items()}
    label_w = min(max(text_width(name) for name in rows) + 16, width * 0.25)
    # the summaries (which name the slowest host) get the room they need, up to half the width
    right = min(max(text_width(text) for text in summaries.values()) + 20, width * 0.5)
    row_h, top = 30, 34
    height = top + row_h * len(rows) + 44
    c = Canvas(title, "", "", width, height)
    values = [v for hosts in rows.values() for v in hosts.values()]
    low, high = min(values), max(values)
    positive = [v for v in values if v > 0]
    log = bool(positive) and min(positive) > 0 and high / min(positive) > 30
    c.x0, c.x1 = round(label_w), round(width - right)
    c.set_x(min(positive) if log else 0.0, high if high > low else high + 1.0, log=log)
    ticks = log_ticks(c.xlo, c.xhi)[2] if log else linear_ticks(c.xlo, c.xhi)[2]
    axis_y = top + row_h * len(rows) + 2
    c.parts += vertical_grid(c.px, ticks, top - 4, axis_y)
    c.parts.append(f'<text x="{(c.x0 + c.x1) / 2:.1f}" y="{axis_y + 32}" text-anchor="middle">seconds until '
                   f"ready{' (log scale)' if log else ''}</text>")
    for i, (name, hosts) in enumerate(sorted(rows.items())):
        y = top + i * row_h + row_h / 2
        ordered = sorted(hosts.values())
        median = median_of(ordered)
        c.parts.append(f'<text x="{label_w - 8:.1f}" y="{y + 4:.1f}" text-anchor="end">'
                       f"{svg_label(name, label_w - 12)}</text>")
        c.parts.append(f'<line x1="{c.px(ordered[0]):.1f}" y1="{y:.1f}" x2="{c.px(ordered[-1]):.1f}" '
                       f'y2="{y:.1f}" stroke="#bbb" stroke-width="2"/>')
        for host, value in sorted(hosts.items()):
            c.parts.append(f'<circle cx="{c.px(value):.1f}" cy="{y:.1f}" r="4" fill="{PALETTE[0]}" '
                           f'fill-opacity="0.6"><title>{escape(host)}: {value:.1f} s</title></circle>')
        mx = c.px(median)
        c.parts.append(f'<line x1="{mx:.1f}" y1="{y - 9:.1f}" x2="{mx:.1f}" y2="{y + 9:.1f}" '
                       f'stroke="{PALETTE[1]}" stroke-width="2"/>')
        summary = summaries[name]
        shown = spread_summary(hosts, room=width - c.x1 - 14)
        tip = f"<title>{escape(summary)}</title>" if shown != summary else ""
        c.parts.append(f'<text x="{c.x1 + 10:.1f}" y="{y + 4:.1f}">{escape(shown)}{tip}</text>')
    return c.svg()


def median_of(ordered: Sequence[float]) -> float:
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def spread_summary(hosts: Mapping[str, float], *, room: float | None = None) -> str:
    """'3 hosts: min 2.1, median 2.4, max 6.7 s (slowest-host)'; within `room` px the numbers stay whole and
    the slowest host's name is shortened in the middle."""
    ordered = sorted(hosts.values())
    slowest = max(hosts, key=lambda h: hosts[h])
    numbers = (f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}: min {fmt(ordered[0])}, median "
               f"{fmt(median_of(ordered))}, max {fmt(ordered[-1])} s")
    if room is not None:
        slowest = fit_text(slowest, room - text_width(numbers + " ()"))
    return f"{numbers} ({slowest})"

