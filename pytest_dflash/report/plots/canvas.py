"""The plots' shared drawing: a plot area mapping data to pixels with axes, ticks, a legend and thresholds
(:class:`Canvas`), text measured and fitted into its room, and :class:`Threshold`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal
from xml.sax.saxutils import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
WIDTH, HEIGHT = 640, 360
M_LEFT, M_RIGHT, M_TOP, M_BOTTOM = 64, 20, 50, 52


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """A floor or ceiling a test judged the plotted number against: drawn as a line, red and marked FAILED
    when the judgement did not pass. `series` names the plotted series it applies to (a CDF's "TTFT"), or
    None for the plot's only one."""

    label: str
    value: float
    kind: Literal["floor", "ceiling"]
    failed: bool = False
    series: str | None = None

    def text(self) -> str:
        return f"{self.kind} {self.label} {fmt(self.value)}" + (" FAILED" if self.failed else "")


FAILED, THRESHOLD_COLOUR = "#c62828", "#555"
_BREAKS = " -/_:,;"  # a word may end after these (a host name's parts, a path's, a list's)


def text_width(text: str, font_size: float = 11) -> float:
    """A generous estimate of a sans-serif text's width in px (0.62 em a character: wider than the average
    glyph of DejaVu Sans / Arial), so that a label placed by it stays inside the SVG."""
    return 0.62 * font_size * len(text)


def fit_text(text: str, room: float, font_size: float = 11) -> str:
    """`text` as fits in `room` px: whole, or its words that fit (a word ends at a space or after - . / _ : ,)
    then an ellipsis; never cut inside a word. Too little room for the first word: the ellipsis alone."""
    if text_width(text, font_size) <= room:
        return text
    keep = max(int(room / (0.62 * font_size)) - 1, 0)
    ends = [i for i in range(1, len(text)) if text[i - 1] in _BREAKS or text[i] == " "]
    end = max((i for i in ends if i <= keep), default=0)
    return text[:end].rstrip() + "…"


def wrap_lines(text: str, room: float, *, font_size: float = 11, max_lines: int = 6) -> list[str]:
    """`text` on as many lines of at most `room` px as it needs (at most `max_lines`, the last one fitted),
    broken at spaces (after a - / _ only where no space is in reach, inside a word only where neither is):
    what a label must say whole (why a service stopped) is wrapped, not cut."""
    per_line = max(int(room / (0.62 * font_size)), 8)
    lines: list[str] = []
    rest = text.strip()
    while rest and len(lines) < max_lines - 1 and text_width(rest, font_size) > room:
        end = rest.rfind(" ", 1, per_line + 1)
        if end <= 0:
            end = max(rest.rfind(c, 1, per_line) + 1 for c in "-/_")
        lines.append(rest[:end if end > 0 else per_line].rstrip())
        rest = rest[end if end > 0 else per_line:].lstrip()
    if rest:
        lines.append(fit_text(rest, room, font_size))
    return lines


def svg_label(text: str, room: float) -> str:
    """`text` escaped, shortened to fit `room` px; a shortened one keeps the whole text as its tooltip."""
    shown = fit_text(text, room)
    return escape(shown) + (f"<title>{escape(text)}</title>" if shown != text else "")


def nice_step(span: float, target: int = 6) -> float:
    """A 1/2/5 x 10^k step giving about ``target`` ticks over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return float(m * mag)
    return 10.0 * mag


def linear_ticks(lo: float, hi: float) -> tuple[float, float, list[float]]:
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    step = nice_step(hi - lo)
    start = math.floor(lo / step) * step
    end = math.ceil(hi / step) * step
    n = round((end - start) / step)
    return start, end, [start + i * step for i in range(n + 1)]


def log_ticks(lo: float, hi: float) -> tuple[float, float, list[float]]:
    lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks = [m * 10.0**e for e in range(lo_e, hi_e + 1) for m in (1, 2, 5) if lo_e <= e]
    ticks = [t for t in ticks if 10.0**lo_e <= t <= 10.0**hi_e]
    return 10.0**lo_e, 10.0**hi_e, ticks


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 10000:
        return f"{v / 1000:g}k"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def vertical_grid(px: Callable[[float], float], ticks: Sequence[float], top: float,
                  axis_y: float) -> list[str]:
    """A horizontal timeline's grid: a light line per tick from `top` down to the axis, its label under it."""
    parts: list[str] = []
    for t in ticks:
        parts.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{axis_y}" stroke="#eee"/>')
        parts.append(f'<text x="{px(t):.1f}" y="{axis_y + 14}" text-anchor="middle">{escape(fmt(t))}</text>')
    return parts


class Canvas:
    """Plot area with data -> pixel mapping, axes, ticks and labels."""

    def __init__(self, title: str, xlabel: str, ylabel: str, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.x0, self.x1 = M_LEFT, width - M_RIGHT
        self.y0, self.y1 = height - M_BOTTOM, M_TOP  # pixel y of data min / max
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.parts: list[str] = []
        self.xlo = self.xhi = self.ylo = self.yhi = 0.0
        self.log_x = False

    def set_x(self, lo: float, hi: float, *, log: bool = False) -> list[float]:
        self.log_x = log
        self.xlo, self.xhi, ticks = log_ticks(lo, hi) if log else linear_ticks(lo, hi)
        return ticks

    def set_y(self, lo: float, hi: float) -> list[float]:
        self.ylo, self.yhi, ticks = linear_ticks(lo, hi)
        return ticks

    def px(self, x: float) -> float:
        if self.log_x:
            x = math.log10(max(x, self.xlo))
            lo, hi = math.log10(self.xlo), math.log10(self.xhi)
        else:
            lo, hi = self.xlo, self.xhi
        return self.x0 + (x - lo) / ((hi - lo) or 1.0) * (self.x1 - self.x0)

    def py(self, y: float) -> float:
        return self.y0 - (y - self.ylo) / ((self.yhi - self.ylo) or 1.0) * (self.y0 - self.y1)

    def axes(self, xticks: Sequence[float], yticks: Sequence[float]) -> None:
        p = self.parts
        for t in yticks:
            y = self.py(t)
            p.append(f'<line x1="{self.x0}" y1="{y:.1f}" x2="{self.x1}" y2="{y:.1f}" stroke="#e5e5e5"/>')
            p.append(f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt(t))}</text>')
        for t in xticks:
            x = self.px(t)
            p.append(f'<line x1="{x:.1f}" y1="{self.y0}" x2="{x:.1f}" y2="{self.y0 + 5}" stroke="#333"/>')
            p.append(f'<text x="{x:.1f}" y="{self.y0 + 18}" text-anchor="middle">{escape(fmt(t))}</text>')
        p.append(f'<line x1="{self.x0}" y1="{self.y0}" x2="{self.x1}" y2="{self.y0}" stroke="#333"/>')
        p.append(f'<line x1="{self.x0}" y1="{self.y0}" x2="{self.x0}" y2="{self.y1}" stroke="#333"/>')
        p.append(f'<text x="{(self.x0 + self.x1) / 2:.1f}" y="{self.h - 12}" text-anchor="middle">'
                 f'{escape(self.xlabel)}</text>')
        cy = (self.y0 + self.y1) / 2
        p.append(f'<text x="16" y="{cy:.1f}" text-anchor="middle" transform="rotate(-90 16 {cy:.1f})">'
                 f'{escape(self.ylabel)}</text>')

    def legend(self, names: Sequence[str], colors: Sequence[str] = PALETTE) -> None:
        """One row of entries above the plot area, wrapped onto a second row (then shortened) when they do
        not fit in the width."""
        x, y = float(self.x0 + 10), float(self.y1 - 12)
        right = self.w - 8
        for i, name in enumerate(names):
            width = 16 + text_width(name)
            if x + width > right and x > self.x0 + 10:
                x, y = float(self.x0 + 10), y + 14
            shown = fit_text(name, right - x - 16)
            color = colors[i % len(colors)]
            self.parts.append(f'<rect x="{x:.1f}" y="{y - 8:.1f}" width="12" height="8" fill="{color}"/>')
            self.parts.append(f'<text x="{x + 16:.1f}" y="{y:.1f}">{escape(shown)}</text>')
            x += 16 + text_width(shown) + 18

    def hline(self, value: float, threshold: Threshold) -> None:
        """A horizontal threshold line across the plot area, labelled at its right end."""
        colour = FAILED if threshold.failed else THRESHOLD_COLOUR
        y = self.py(value)
        self.parts.append(f'<line x1="{self.x0}" y1="{y:.1f}" x2="{self.x1}" y2="{y:.1f}" stroke="{colour}" '
                          f'stroke-width="1.5" stroke-dasharray="8 3" class="dflash-threshold">'
                          f"<title>{escape(threshold.text())}</title></line>")
        text = fit_text(threshold.text(), self.x1 - self.x0 - 8)
        self.parts.append(f'<text x="{self.x1 - 4}" y="{y - 4:.1f}" text-anchor="end" fill="{colour}">'
                          f"{escape(text)}</text>")

    def vline(self, value: float, threshold: Threshold, *, row: int = 0) -> None:
        """A vertical threshold line over the plot area, labelled beside it (left of it near the right
        edge)."""
        colour = FAILED if threshold.failed else THRESHOLD_COLOUR
        x = self.px(value)
        self.parts.append(f'<line x1="{x:.1f}" y1="{self.y0}" x2="{x:.1f}" y2="{self.y1}" stroke="{colour}" '
                          f'stroke-width="1.5" stroke-dasharray="8 3" class="dflash-threshold">'
                          f"<title>{escape(threshold.text())}</title></line>")
        text = fit_text(threshold.text(), max(x - self.x0, self.x1 - x) - 8)
        left = x + 4 + text_width(text) > self.w - 4
        self.parts.append(f'<text x="{x - 4 if left else x + 4:.1f}" y="{self.y1 + 12 + 13 * row:.1f}" '
                          f'text-anchor="{"end" if left else "start"}" fill="{colour}">{escape(text)}</text>')

    def svg(self) -> str:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
                f'viewBox="0 0 {self.w} {self.h}" role="img" font-family="sans-serif" font-size="11">')
        title = (f'<title>{escape(self.title)}</title><rect width="100%" height="100%" fill="#fff"/>'
                 f'<text x="{self.w / 2:.1f}" y="18" text-anchor="middle" font-size="13" font-weight="bold">'
                 f'{escape(self.title)}</text>')
        return head + title + "".join(self.parts) + "</svg>"


def empty_plot(title: str, width: int, height: int, why: str) -> str:
    c = Canvas(title, "", "", width, height)
    c.parts.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" fill="#666">'
                   f'{escape(why)}</text>')
    return c.svg()


