"""A load sweep's pictures (load/curve.py's :class:`SweepCurve`), concurrency on a log2 x axis:

* :func:`sweep_throughput_svg` — output tok/s of every service, each point with its bounds as an error bar;
* :func:`sweep_latency_svg` — a latency percentile (TTFT p99, TPOT p99) of every service, the region within
  the SLO ceiling shaded, the ceiling drawn as a threshold line, the points that broke it as red crosses;
* :func:`sweep_speedup_svg` — a speculative service over its plain twin with its bounds, the 1x line and the
  crossover marked and labelled ("slower than none from concurrency 16").

A level that was not measured (budget spent, early stop) is never drawn as a point: its column carries a
dashed line and "not run: budget", the whole reason as its tooltip.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from xml.sax.saxutils import escape

from pytest_dflash.load.curve import Interval, LevelPoint, SpeedupCurve, SweepCurve
from pytest_dflash.report.plots.canvas import (
    HEIGHT,
    PALETTE,
    WIDTH,
    Canvas,
    empty_plot,
    fit_text,
    fmt,
)

__all__ = ["LATENCY_PLOTS", "latency_keys", "latency_label", "latency_value", "not_run_label",
           "sweep_latency_svg", "sweep_plots", "sweep_speedup_svg", "sweep_throughput_svg"]

# Dark enough for text on white at >= 7:1 (the project's contrast bar): a red and a grey for labels.
TEXT_RED, TEXT_GREY = "#8b1a1a", "#4a4a4a"
BROKE = "#c62828"  # the marker of a point that broke its SLO (a cross: its shape says it without colour)
BAND = "#2e7d32"  # the region within an SLO ceiling, drawn faint
HALO = 'stroke="#fff" stroke-width="3" paint-order="stroke"'  # a label legible over the lines it crosses
# The services' colours: canvas's colour-blind-safe palette without its red ("broke the SLO" here) and green
# (the SLO band)
SERIES = tuple(c for c in PALETTE if c not in ("#d62728", "#2ca02c"))
XLABEL = "concurrency (concurrent requests, log2 scale)"
OFF_SCALE = 3.0  # a latency SLO more than 3x the highest point is labelled at the top, not drawn to scale
LATENCY_PLOTS = ("ttft", "tpot")  # always drawn; e2e and itl too where an SLO judges them
_STAT = re.compile(r"^(?P<metric>ttft|tpot|itl|e2e)_(?P<stat>p\d+(?:\.\d+)?|median|mean)_ms$")


class _Plot(Canvas):
    """A Canvas whose drawn title is fitted to the width (a host's long name shortened after a word), the
    whole title kept as the SVG's <title>."""

    def svg(self) -> str:
        full = self.title
        self.title = fit_text(full, self.w - 16, 13)
        shown, drawn = self.title, super().svg()
        self.title = full
        return drawn.replace(f"<title>{escape(shown)}</title>", f"<title>{escape(full)}</title>", 1)


def latency_label(key: str) -> str:
    """'ttft_p90_ms' -> 'TTFT p90', 'tpot_mean_ms' -> 'TPOT mean', 'e2e_p90_ms' -> 'e2e p90'."""
    found = _STAT.match(key)
    if found is None:
        return key
    metric = found["metric"]
    return f"{metric if metric == 'e2e' else metric.upper()} {found['stat']}"


def latency_keys(curve: SweepCurve) -> list[str]:
    """The latency pictures of a sweep: TTFT and TPOT, and e2e / ITL where an SLO judges them, each at the
    statistic the SLO judges (a p90 SLO is drawn over the p90s, never over the p99s), else at p99."""
    objectives = {key for service in curve.services for key in service.slo} | set(curve.slo)
    keys = []
    for metric in ("ttft", "tpot", "e2e", "itl"):
        judged = sorted(k for k in objectives if (m := _STAT.match(k)) and m["metric"] == metric)
        if judged:
            keys += judged
        elif metric in LATENCY_PLOTS:
            keys.append(f"{metric}_p99_ms")
    return keys


def latency_value(point: LevelPoint, key: str) -> float | None:
    """A level's `key`: its percentile (LATENCY_KEYS), else the point its SLO check measured (ttft_p90_ms)."""
    value = point.latency.get(key)
    if value is None:
        value = next((c.point for c in point.slo_checks if c.key == key), None)
    return value


def not_run_label(why: str | None) -> str:
    """A not-run level's short label: 'not run: budget', 'not run: early stop', 'not run: not ready'."""
    text = (why or "").lower()
    if "budget" in text:
        return "not run: budget"
    if "early stop" in text or "broke its slo" in text:
        return "not run: early stop"
    if "not ready" in text:
        return "not run: not ready"
    return "not run"


def _x_axis(c: Canvas, levels: Sequence[int]) -> list[float]:
    """A log2 axis whose ticks are the sweep's levels, half a step of room either side."""
    lo, hi = min(levels), max(levels)
    c.log_x = True
    c.xlo, c.xhi = lo / 1.6, hi * 1.6
    return [float(level) for level in sorted(set(levels))]


def _y_top(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return (max(finite) * 1.12) if finite and max(finite) > 0 else 1.0


def _offset(index: int, count: int) -> float:
    """Services side by side around a level, so their error bars do not hide each other."""
    return (index - (count - 1) / 2) * 7.0


def _error_bar(c: Canvas, x: float, value: Interval, colour: str, tip: str) -> None:
    """A vertical bar from the lower to the upper bound (a missing bound: the bar stops at the point, its
    tooltip says it has none), capped at both ends."""
    lower = value.lower if value.lower is not None else value.point
    upper = value.upper if value.upper is not None else value.point
    y_lo, y_hi = c.py(max(lower, c.ylo)), c.py(min(upper, c.yhi))
    missing = [side for side, bound in (("lower", value.lower), ("upper", value.upper)) if bound is None]
    if missing:  # e.g. the p99 of too few requests has no finite upper bound: the bar stops at the point
        tip += f" (no finite {' or '.join(missing)} bound)"
    c.parts.append(f'<g class="dflash-error-bar" stroke="{colour}" stroke-width="1.3"><title>{escape(tip)}'
                   f'</title><line x1="{x:.1f}" y1="{y_lo:.1f}" x2="{x:.1f}" y2="{y_hi:.1f}"/>'
                   f'<line x1="{x - 3:.1f}" y1="{y_lo:.1f}" x2="{x + 3:.1f}" y2="{y_lo:.1f}"/>'
                   f'<line x1="{x - 3:.1f}" y1="{y_hi:.1f}" x2="{x + 3:.1f}" y2="{y_hi:.1f}"/></g>')


def _marker(c: Canvas, x: float, y: float, colour: str, tip: str, *, broke: bool = False) -> None:
    if broke:  # a cross in red over the service's dot: the shape tells it without the colour
        c.parts.append(f'<g class="dflash-slo-broken" stroke="{BROKE}" stroke-width="2.2">'
                       f'<title>{escape(tip)}</title>'
                       f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}" stroke="none"/>'
                       f'<line x1="{x - 5:.1f}" y1="{y - 5:.1f}" x2="{x + 5:.1f}" y2="{y + 5:.1f}"/>'
                       f'<line x1="{x - 5:.1f}" y1="{y + 5:.1f}" x2="{x + 5:.1f}" y2="{y - 5:.1f}"/></g>')
        return
    c.parts.append(f'<circle class="dflash-point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}">'
                   f"<title>{escape(tip)}</title></circle>")


def _line(c: Canvas, points: Sequence[tuple[float, float]], colour: str) -> None:
    if len(points) > 1:
        path = " ".join(f"{x:.1f},{c.py(y):.1f}" for x, y in points)
        c.parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')


def _not_run(c: Canvas, missing: dict[int, list[tuple[str, str]]], everyone: int) -> None:
    """Each level some service did not run: a dashed column and its label (the services named unless it is
    all of them), the whole reason as the tooltip."""
    for row, (level, entries) in enumerate(sorted(missing.items())):
        x = c.px(level)
        whys = "; ".join(f"{service}: {why}" for service, why in entries)
        labels = sorted({not_run_label(why) for _, why in entries})
        who = "" if len(entries) == everyone else ", ".join(service for service, _ in entries) + " "
        text = fit_text(who + " / ".join(labels), max(x - c.x0, c.x1 - x) * 2 - 8)
        c.parts.append(f'<g class="dflash-not-run" data-level="{level}"><title>concurrency {level}: '
                       f'{escape(whys)}</title><line x1="{x:.1f}" y1="{c.y0}" x2="{x:.1f}" y2="{c.y1}" '
                       f'stroke="#9e9e9e" stroke-dasharray="3 4"/>'
                       f'<text x="{x:.1f}" y="{c.y0 - 8 - 13 * (row % 2):.1f}" text-anchor="middle" '
                       f'fill="{TEXT_GREY}" font-style="italic" {HALO}>{escape(text)}</text></g>')


def _ceiling(c: Canvas, value: float, text: str, broken: bool) -> None:
    """An SLO ceiling: a dashed threshold line across the plot, labelled at its right end in dark text; one
    above the y axis is only labelled, under the plot's top edge."""
    above = value > c.yhi
    y = c.py(min(value, c.yhi))
    colour = BROKE if broken else "#555"
    line = ("" if above else f'<line x1="{c.x0}" y1="{y:.1f}" x2="{c.x1}" y2="{y:.1f}" stroke="{colour}" '
                             'stroke-width="1.5" stroke-dasharray="8 3"/>')
    c.parts.append(f'<g class="dflash-threshold dflash-slo-ceiling"><title>{escape(text)}</title>{line}'
                   f'<text x="{c.x1 - 4}" y="{y + 14 if above else y - 5:.1f}" text-anchor="end" '
                   f'fill="{TEXT_RED if broken else "#1a1a1a"}" {HALO}>'
                   f"{escape(fit_text(text, c.x1 - c.x0 - 8))}</text></g>")


def _measured(point: LevelPoint) -> bool:
    return point.measured and point.output_tok_s is not None


def sweep_throughput_svg(curve: SweepCurve, *, width: int = WIDTH, height: int = HEIGHT) -> str:
    """Output tok/s against concurrency for every service, each point with its bounds as an error bar."""
    title = f"Output tok/s against load — {curve.host}"
    values = [v for s in curve.services for p in s.levels if p.output_tok_s is not None
              for v in (p.output_tok_s.point, p.output_tok_s.upper or p.output_tok_s.point)]
    if not curve.levels or not curve.services:
        return empty_plot(title, width, height, "no sweep")
    c = _Plot(title, XLABEL, "output tokens/s (95% bounds)", width, height)
    xticks = _x_axis(c, curve.levels)
    c.axes(xticks, c.set_y(0.0, _y_top(values)))
    missing: dict[int, list[tuple[str, str]]] = {}
    names, colours = [], []
    for i, service in enumerate(curve.services):
        colour = SERIES[i % len(SERIES)]
        shift = _offset(i, len(curve.services))
        line = []
        for point in service.levels:
            if not _measured(point) or point.output_tok_s is None:
                why = point.why or "not measured"
                missing.setdefault(point.concurrency, []).append((service.service, why))
                continue
            tok = point.output_tok_s
            x = c.px(point.concurrency) + shift
            tip = f"{service.service} at concurrency {point.concurrency}: {tok.describe(' tok/s')}"
            _error_bar(c, x, tok, colour, tip)
            _marker(c, x, c.py(tok.point), colour, tip)
            line.append((x, tok.point))
        _line(c, line, colour)
        names.append(f"{service.service} ({service.algorithm})")
        colours.append(colour)
    _not_run(c, missing, len(curve.services))
    c.legend(names, colours)
    return c.svg()


def _slo_of(curve: SweepCurve, key: str) -> dict[float, list[str]]:
    """{ceiling: [services judged by it]} for one latency key ([slo] and [slo.SERVICE])."""
    out: dict[float, list[str]] = {}
    for service in curve.services:
        value = service.slo.get(key, curve.slo.get(key))
        if value is not None and math.isfinite(value):
            out.setdefault(float(value), []).append(service.service)
    return out


def sweep_latency_svg(curve: SweepCurve, key: str, *, width: int = WIDTH, height: int = HEIGHT) -> str:
    """`key` (ttft_p99_ms, tpot_p99_ms) against concurrency for every service; its SLO ceiling as a line over
    a shaded band (the region within it), each point that broke it a red cross, the check's bounds as error
    bars where the SLO judged them."""
    label = latency_label(key)
    title = f"{label} against load — {curve.host}"
    ceilings = _slo_of(curve, key)
    values = [v for s in curve.services for p in s.measured if (v := latency_value(p, key)) is not None]
    if not values:
        return empty_plot(title, width, height, f"no {label} measured")
    c = _Plot(title, XLABEL, f"{label} (ms)", width, height)
    xticks = _x_axis(c, curve.levels)
    # a ceiling far above every point would flatten them onto the axis: it is then said, not drawn to scale
    shown = [ceiling for ceiling in ceilings if ceiling <= OFF_SCALE * max(values)]
    c.axes(xticks, c.set_y(0.0, _y_top([*values, *shown])))
    for ceiling, services in sorted(ceilings.items()):  # the band first: points and lines go over it
        y = c.py(min(ceiling, c.yhi))
        who = "" if len(services) == len(curve.services) else f" ({', '.join(services)})"
        c.parts.append(f'<rect class="dflash-slo-band" x="{c.x0}" y="{y:.1f}" width="{c.x1 - c.x0}" '
                       f'height="{c.y0 - y:.1f}" fill="{BAND}" fill-opacity="0.09"><title>within the SLO: '
                       f"{escape(key)} ≤ {fmt(ceiling)} ms{escape(who)}</title></rect>")
    missing: dict[int, list[tuple[str, str]]] = {}
    names, colours, broke_any = [], [], False
    for i, service in enumerate(curve.services):
        colour = SERIES[i % len(SERIES)]
        shift = _offset(i, len(curve.services))
        line = []
        for point in service.levels:
            value = latency_value(point, key) if point.measured else None
            if value is None:
                if not point.measured:
                    why = point.why or "not run"
                    missing.setdefault(point.concurrency, []).append((service.service, why))
                continue
            x = c.px(point.concurrency) + shift
            check = next((s for s in point.slo_checks if s.key == key), None)
            broke = check is not None and check.outcome == "fail"
            broke_any |= broke
            tip = f"{service.service} at concurrency {point.concurrency}: {label} {fmt(value)} ms"
            if check is not None:
                tip += f"; SLO {check.outcome}: {check.message}"
                bounds = Interval(point=value, lower=check.lower, upper=check.upper)
                if check.lower is not None or check.upper is not None:
                    _error_bar(c, x, bounds, colour, tip)
            _marker(c, x, c.py(value), colour, tip, broke=broke)
            line.append((x, value))
        _line(c, line, colour)
        names.append(f"{service.service} ({service.algorithm})")
        colours.append(colour)
    for ceiling, services in sorted(ceilings.items()):
        who = "" if len(services) == len(curve.services) else f" ({', '.join(services)})"
        broken = any(chk.key == key and chk.outcome == "fail" for s in curve.services if s.service in services
                     for p in s.measured for chk in p.slo_checks)
        text = f"SLO {label}{who} ≤ {fmt(ceiling)} ms" + (": broken" if broken else "")
        _ceiling(c, ceiling, text if ceiling in shown else text + " (above this scale)", broken)
    if ceilings:
        names.append("within the SLO (shaded)")
        colours.append(BAND)
    if broke_any:
        names.append("× broke the SLO")
        colours.append(BROKE)
    _not_run(c, missing, len(curve.services))
    c.legend(names, colours)
    return c.svg()


def sweep_speedup_svg(curve: SweepCurve, speedup: SpeedupCurve, *, width: int = WIDTH,
                      height: int = HEIGHT) -> str:
    """`speedup.service`'s output tok/s over its twin's at each level with its bounds, the 1x line (as fast as
    the twin) and the crossover (the first level confidently below 1x) marked and labelled."""
    title = f"Speed-up of {speedup.service} over {speedup.versus} — {curve.host}"
    ratios = [p.ratio for p in speedup.points if p.ratio is not None]
    if not ratios:
        return empty_plot(title, width, height, f"no level where both {speedup.service} and "
                                                f"{speedup.versus} were measured")
    c = _Plot(title, XLABEL, f"output tok/s ÷ {speedup.versus}'s (×, 95% bounds)", width, height)
    xticks = _x_axis(c, curve.levels or tuple(p.concurrency for p in speedup.points))
    top = _y_top([1.0, *(r.upper or r.point for r in ratios)])
    c.axes(xticks, c.set_y(0.0, top))
    y = c.py(1.0)
    c.parts.append(f'<g class="dflash-one-x"><line x1="{c.x0}" y1="{y:.1f}" x2="{c.x1}" y2="{y:.1f}" '
                   f'stroke="#333" stroke-width="1.2"/><text x="{c.x0 + 4}" y="{y - 4:.1f}" fill="#1a1a1a">'
                   f"1× = as fast as {escape(speedup.versus)}</text></g>")
    colour = SERIES[0]
    line, missing = [], {}
    for point in speedup.points:
        if point.ratio is None:
            missing[point.concurrency] = [(speedup.service, point.why or "not measured")]
            continue
        ratio = point.ratio
        x = c.px(point.concurrency)
        tip = (f"{speedup.service} / {speedup.versus} at concurrency {point.concurrency}: "
               f"{ratio.describe('x')}")
        _error_bar(c, x, ratio, colour, tip)
        below = ratio.upper is not None and ratio.upper < 1.0
        _marker(c, x, c.py(ratio.point), colour, tip, broke=below)
        line.append((x, ratio.point))
    _line(c, line, colour)
    if speedup.crossover is not None:
        x = c.px(speedup.crossover)
        text = f"slower than {speedup.versus} from concurrency {speedup.crossover}"
        left = x + 6 + len(text) * 0.62 * 11 > c.x1
        c.parts.append(f'<g class="dflash-crossover" data-level="{speedup.crossover}"><title>'
                       f"{escape(speedup.crossover_text or text)}</title>"
                       f'<line x1="{x:.1f}" y1="{c.y0}" x2="{x:.1f}" y2="{c.y1}" stroke="{TEXT_RED}" '
                       f'stroke-width="1.5" stroke-dasharray="6 3"/>'
                       f'<text x="{x - 6 if left else x + 6:.1f}" y="{c.y1 + 14}" fill="{TEXT_RED}" '
                       f'font-weight="bold" text-anchor="{"end" if left else "start"}" {HALO}>{escape(text)}'
                       "</text></g>")
    names = [f"{speedup.service} ({speedup.algorithm}) ÷ {speedup.versus} ({speedup.versus_algorithm})"]
    colours = [colour]
    if speedup.crossover is not None:
        names.append("× slower than 1× (upper bound < 1)")
        colours.append(BROKE)
    else:
        last = max((p.concurrency for p in speedup.points if p.ratio is not None), default=None)
        c.parts.append(f'<text class="dflash-no-crossover" x="{c.x1 - 4}" y="{c.y1 + 14}" text-anchor="end" '
                       f'fill="#1a1a1a">no crossover up to concurrency {last}</text>')
    _not_run(c, missing, 1)
    c.legend(names, colours)
    return c.svg()


def sweep_plots(curve: SweepCurve) -> dict[str, str]:
    """Every picture of a host's sweep: "throughput", a latency picture per key of :func:`latency_keys`
    (where measured: "ttft_p99_ms", "tpot_p99_ms" …) and "speedup:<service>:<twin>" for each speed-up."""
    out = {"throughput": sweep_throughput_svg(curve)}
    for key in latency_keys(curve):
        if any(latency_value(p, key) is not None for s in curve.services for p in s.measured):
            out[key] = sweep_latency_svg(curve, key)
    for speedup in curve.speedups:
        out[f"speedup:{speedup.service}:{speedup.versus}"] = sweep_speedup_svg(curve, speedup)
    return out
