"""Performance plots as standalone SVG strings (hand-written SVG, no plotting dependency).

* :func:`latency_cdf_svg` — empirical CDFs of latency series (TTFT, e2e …), log x axis when the
  values span more than a decade and a half;
* :func:`tokens_over_time_svg` — output tokens/s over the run, per time bin;
* :func:`accept_length_histogram_svg` — per-request speculative accept lengths;
* :func:`plots_for_result` — the three for a :class:`~pytest_dflash.load.LoadResult`;
* :func:`cold_start_timeline_svg` — one host's services side by side on one clock, each bar cut into its
  start-up phases (from the verdict's `services[<svc>]["ready"]`);
* :func:`readiness_spread_svg` — each service's readiness seconds across the hosts of a fleet.

Every function returns one ``<svg>`` element (valid XML, ``xmlns`` set, a ``<title>`` for screen
readers) that can be embedded in HTML as is or written to a ``.svg`` file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from pytest_dflash.load import LoadResult

__all__ = ["Threshold", "accept_length_histogram_svg", "cold_start_phases", "cold_start_timeline_svg",
           "latency_cdf_svg", "phase_legend_svg", "phase_order", "phase_style", "plots_for_result",
           "readiness_spread_svg", "stopped_in", "stopped_phases", "text_width", "tokens_over_time_svg"]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
_W, _H = 640, 360
_M_LEFT, _M_RIGHT, _M_TOP, _M_BOTTOM = 64, 20, 50, 52




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
        return f"{self.kind} {self.label} {_fmt(self.value)}" + (" FAILED" if self.failed else "")


_FAILED, _THRESHOLD = "#c62828", "#555"


def text_width(text: str, font_size: float = 11) -> float:
    """A generous estimate of a sans-serif text's width in px (0.62 em a character: wider than the average
    glyph of DejaVu Sans / Arial), so that a label placed by it stays inside the SVG."""
    return 0.62 * font_size * len(text)


def _fit(text: str, room: float, font_size: float = 11) -> str:
    """`text`, shortened in the middle with an ellipsis, so that it fits in `room` px."""
    if text_width(text, font_size) <= room:
        return text
    keep = max(int(room / (0.62 * font_size)) - 1, 2)
    head = (keep + 1) // 2
    return text[:head] + "…" + text[len(text) - (keep - head):]


def _label(text: str, room: float) -> str:
    """`text` escaped, shortened to fit `room` px; a shortened one keeps the whole text as its tooltip."""
    shown = _fit(text, room)
    return escape(shown) + (f"<title>{escape(text)}</title>" if shown != text else "")


def _nice_step(span: float, target: int = 6) -> float:
    """A 1/2/5 x 10^k step giving about ``target`` ticks over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return float(m * mag)
    return 10.0 * mag


def _linear_ticks(lo: float, hi: float) -> tuple[float, float, list[float]]:
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    step = _nice_step(hi - lo)
    start = math.floor(lo / step) * step
    end = math.ceil(hi / step) * step
    n = round((end - start) / step)
    return start, end, [start + i * step for i in range(n + 1)]


def _log_ticks(lo: float, hi: float) -> tuple[float, float, list[float]]:
    lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks = [m * 10.0**e for e in range(lo_e, hi_e + 1) for m in (1, 2, 5) if lo_e <= e]
    ticks = [t for t in ticks if 10.0**lo_e <= t <= 10.0**hi_e]
    return 10.0**lo_e, 10.0**hi_e, ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 10000:
        return f"{v / 1000:g}k"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


class _Canvas:
    """Plot area with data -> pixel mapping, axes, ticks and labels."""

    def __init__(self, title: str, xlabel: str, ylabel: str, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.x0, self.x1 = _M_LEFT, width - _M_RIGHT
        self.y0, self.y1 = height - _M_BOTTOM, _M_TOP  # pixel y of data min / max
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.parts: list[str] = []
        self.xlo = self.xhi = self.ylo = self.yhi = 0.0
        self.log_x = False

    def set_x(self, lo: float, hi: float, *, log: bool = False) -> list[float]:
        self.log_x = log
        self.xlo, self.xhi, ticks = _log_ticks(lo, hi) if log else _linear_ticks(lo, hi)
        return ticks

    def set_y(self, lo: float, hi: float) -> list[float]:
        self.ylo, self.yhi, ticks = _linear_ticks(lo, hi)
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
            p.append(f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(t))}</text>')
        for t in xticks:
            x = self.px(t)
            p.append(f'<line x1="{x:.1f}" y1="{self.y0}" x2="{x:.1f}" y2="{self.y0 + 5}" stroke="#333"/>')
            p.append(f'<text x="{x:.1f}" y="{self.y0 + 18}" text-anchor="middle">{escape(_fmt(t))}</text>')
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
            shown = _fit(name, right - x - 16)
            color = colors[i % len(colors)]
            self.parts.append(f'<rect x="{x:.1f}" y="{y - 8:.1f}" width="12" height="8" fill="{color}"/>')
            self.parts.append(f'<text x="{x + 16:.1f}" y="{y:.1f}">{escape(shown)}</text>')
            x += 16 + text_width(shown) + 18

    def hline(self, value: float, threshold: Threshold) -> None:
        """A horizontal threshold line across the plot area, labelled at its right end."""
        colour = _FAILED if threshold.failed else _THRESHOLD
        y = self.py(value)
        self.parts.append(f'<line x1="{self.x0}" y1="{y:.1f}" x2="{self.x1}" y2="{y:.1f}" stroke="{colour}" '
                          f'stroke-width="1.5" stroke-dasharray="8 3" class="dflash-threshold">'
                          f"<title>{escape(threshold.text())}</title></line>")
        text = _fit(threshold.text(), self.x1 - self.x0 - 8)
        self.parts.append(f'<text x="{self.x1 - 4}" y="{y - 4:.1f}" text-anchor="end" fill="{colour}">'
                          f"{escape(text)}</text>")

    def vline(self, value: float, threshold: Threshold, *, row: int = 0) -> None:
        """A vertical threshold line over the plot area, labelled beside it (left of it near the right
        edge)."""
        colour = _FAILED if threshold.failed else _THRESHOLD
        x = self.px(value)
        self.parts.append(f'<line x1="{x:.1f}" y1="{self.y0}" x2="{x:.1f}" y2="{self.y1}" stroke="{colour}" '
                          f'stroke-width="1.5" stroke-dasharray="8 3" class="dflash-threshold">'
                          f"<title>{escape(threshold.text())}</title></line>")
        text = _fit(threshold.text(), max(x - self.x0, self.x1 - x) - 8)
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


def _empty(title: str, width: int, height: int, why: str) -> str:
    c = _Canvas(title, "", "", width, height)
    c.parts.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" fill="#666">'
                   f'{escape(why)}</text>')
    return c.svg()


def latency_cdf_svg(series: Mapping[str, Sequence[float]], *, title: str = "Latency CDF",
                    xlabel: str = "latency (ms)", log_x: bool | None = None, width: int = _W,
                    height: int = _H, thresholds: Sequence[Threshold] = ()) -> str:
    """Empirical CDFs (step lines) of one or more latency series, with p50/p99 in the legend and each ceiling
    judged on them as a vertical line (the axis stretched to show it)."""
    data = {k: sorted(float(v) for v in vs if math.isfinite(v)) for k, vs in series.items()}
    data = {k: v for k, v in data.items() if v}
    if not data:
        return _empty(title, width, height, "no successful requests")
    lines = [t for t in thresholds if math.isfinite(t.value) and t.value > 0]
    lo = min(v[0] for v in data.values())
    hi = max([v[-1] for v in data.values()] + [t.value for t in lines])
    if log_x is None:
        log_x = lo > 0 and hi / lo > 30
    if log_x and lo <= 0:
        log_x = False
    c = _Canvas(title, xlabel + (" (log scale)" if log_x else ""), "fraction of requests", width, height)
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
        names.append(f"{name} p50 {_fmt(p50)} p99 {_fmt(p99)}")
    c.legend(names)
    for row, threshold in enumerate(lines):
        c.vline(threshold.value, threshold, row=row + 2)
    return c.svg()


def tokens_over_time_svg(points: Sequence[tuple[float, float]], *, title: str = "Output tokens/s over time",
                         width: int = _W, height: int = _H, headline: float | None = None,
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
        return _empty(title, width, height, "no token timing data")
    last = pts.pop() if partial is not None and len(pts) > 1 else None
    lines = [t for t in thresholds if math.isfinite(t.value)]
    c = _Canvas(title, "time since start (s)", "output tokens/s", width, height)
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
                       f"{bin_s:.2f} s before the run ended ({_fmt(last[1])} tok/s), not a slow-down"
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


def accept_length_histogram_svg(values: Sequence[float], *, title: str = "Accept length per request",
                                bins: int | None = None, width: int = _W, height: int = _H,
                                mean: float | None = None, thresholds: Sequence[Threshold] = ()) -> str:
    """Histogram of per-request accept lengths (tokens per verify step).

    `mean`: the run's accept length as its headline states it (Σ output tokens / Σ verify steps, which weighs
    a long request more than the plain mean of the per-request values does), drawn as a vertical line; the
    plain mean of `values` when not given. `thresholds`: the accept-length floor judged on the run."""
    vals = [float(v) for v in values if math.isfinite(v)]
    if not vals:
        return _empty(title, width, height, "no accept-length data (native /generate with speculation only)")
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
    c = _Canvas(title, "accept length (tokens per verify step)", "requests", width, height)
    xticks = c.set_x(min([lo] + [t.value for t in lines]), max([hi] + [t.value for t in lines]))
    yticks = c.set_y(0.0, max(counts) * 1.25)
    c.axes(xticks, yticks)
    for i, n in enumerate(counts):
        x1, x2 = c.px(edges[i]), c.px(edges[i + 1])
        y = c.py(n)
        c.parts.append(f'<rect x="{x1 + 0.5:.1f}" y="{y:.1f}" width="{max(x2 - x1 - 1, 0.5):.1f}" '
                       f'height="{c.y0 - y:.1f}" fill="{PALETTE[2]}"><title>{escape(_fmt(edges[i]))}–'
                       f'{escape(_fmt(edges[i + 1]))}: {n}</title></rect>')
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


# ---- cold start --------------------------------------------------------------------------------------------

# A service's start-up phases, in order: the name of the moment each one ENDS (the keys of ready["phases"], in
# seconds from the start of the wait), what happens until then, and its colour.
PHASES: dict[str, tuple[str, str]] = {
    "process_started": ("process start", "#9e9e9e"),
    "weights_loaded": ("loading weights", "#1f77b4"),
    "kv_cache_allocated": ("allocating KV cache", "#17becf"),
    "cuda_graphs_captured": ("capturing CUDA graphs", "#9467bd"),
    "port_open": ("until the port opened", "#8c564b"),
    "first_greedy": ("first greedy answer", "#2ca02c"),
    "first_sampled": ("first sampled answer (sampling JIT)", "#ff7f0e"),
}
_OTHER = ("other readiness checks", "#e0e0e0")


def _seconds(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def cold_start_phases(ready: Mapping[str, object]) -> list[tuple[str, float, float]]:
    """(phase, start s, end s) from the start of the wait, in order, from `ready["phases"]` where the service
    reported them, and from `http_s` / `greedy_s` / `sampled_s` for the port and first answers it did not (an
    SGLang version that logs no line for one); what is left until `total_s` is "other"."""
    ends: dict[str, float] = {}
    for key, phase in (("http_s", "port_open"), ("greedy_s", "first_greedy"), ("sampled_s", "first_sampled")):
        if (value := _seconds(ready.get(key))) is not None:
            ends[phase] = value
    raw = ready.get("phases")
    if isinstance(raw, Mapping):
        ends.update({str(k): t for k, v in raw.items() if (t := _seconds(v)) is not None})
    known = [k for k in PHASES if k in ends] + [k for k in ends if k not in PHASES]
    out: list[tuple[str, float, float]] = []
    start = 0.0
    for name in sorted(known, key=lambda k: ends[k]):  # by time: a phase a version logs late still draws
        end = ends[name]
        out.append((name, start, end))
        start = end
    total = _seconds(ready.get("total_s"))
    if total is not None and total > start + 1e-3:
        out.append(("other", start, total))
    return out


def phase_order(names: Iterable[str]) -> list[str]:
    """The phases among `names` in start-up order ("other" after the known ones), then any a version logs that
    this table does not know, sorted: the legend's order and the HTML table's columns."""
    seen = set(names)
    known = [p for p in [*PHASES, "other"] if p in seen]
    return known + sorted(seen - set(known))


def phase_style(name: str) -> tuple[str, str]:
    """A phase's (label, colour) in the timeline and the table."""
    if name == "other":
        return _OTHER
    return PHASES.get(name, (name.replace("_", " "), "#bcbd22"))


def stopped_phases(stopped: Mapping[str, object]) -> list[tuple[str, float, float]]:
    """The phases a start-up that never became ready finished: its time after the last one is where it
    stopped, not "other"."""
    return [phase for phase in cold_start_phases(stopped) if phase[0] != "other"]


def stopped_in(stopped: Mapping[str, object]) -> str:
    """Where a start-up that never became ready stopped, from the HTTP milestones it reached."""
    if _seconds(stopped.get("http_s")) is None:
        return "before its port opened"
    if _seconds(stopped.get("greedy_s")) is None:
        return "in its first greedy request"
    return "in its first sampled request"


def cold_start_timeline_svg(services: Mapping[str, Mapping[str, object]], *, title: str = "Cold start",
                            width: int = 900, legend: bool = True,
                            failed: Mapping[str, str] | None = None,
                            stopped: Mapping[str, Mapping[str, object]] | None = None) -> str | None:
    """One host's services side by side on one clock (seconds from the first wait's start; each service's bar
    starts where its own wait began, `waited_from`), each bar cut into its phases, coloured, with a tooltip
    per phase and the total at its end. `services`: {name: the verdict's ready dict}. `failed`: {name: why}
    of the services that never became ready, drawn first, in red: their phases up to where they stopped
    (`stopped`: {name: the verdict's stopped dict}, when the wait recorded one), the time after the last
    phase until the failure hatched, and a line saying where it stopped and why. None when there is nothing
    to draw. `legend=False`: no legend (a page of several hosts draws one, :func:`phase_legend_svg`)."""
    stopped = stopped or {}
    failed = {name: why for name, why in (failed or {}).items()
              if not cold_start_phases(services.get(name, {}))}
    rows: list[tuple[str, float, list[tuple[str, float, float]]]] = []
    partial: list[tuple[str, float, list[tuple[str, float, float]], float, str]] = []
    starts = [w for r in [*services.values(), *(stopped.get(n, {}) for n in failed)]
              if (w := _seconds(r.get("waited_from"))) is not None]
    t0 = min(starts) if starts else 0.0

    def offset(facts: Mapping[str, object]) -> float:
        waited = _seconds(facts.get("waited_from"))
        return (waited - t0) if waited is not None else 0.0

    for name, ready in services.items():
        if phases := cold_start_phases(ready):
            rows.append((name, offset(ready), phases))
    for name, why in failed.items():
        facts = stopped.get(name) or {}
        phases = stopped_phases(facts)
        total = _seconds(facts.get("total_s")) or 0.0
        where = f" (stopped {stopped_in(facts)}, after {total:.1f} s)" if facts else ""
        partial.append((name, offset(facts), phases, total, f"never ready{where}: {why}"))
    if not rows and not partial:
        return None
    label_w, row_h, top = 150, 26, 34
    fail_h = row_h + 30  # a failed row: its bar, then two lines saying where and why it stopped
    drawn = [*(phases for _, _, phases in rows), *(phases for _, _, phases, _, _ in partial)]
    legend_names = phase_order(ph for phases in drawn for ph, _, _ in phases) if legend else []
    height = (top + row_h * len(rows) + fail_h * len(partial) + 40 + 18 * ((len(legend_names) + 2) // 3)
              + (0 if legend else -4))
    c = _Canvas(title, "", "", width, height)
    span = max([*(off + phases[-1][2] for _, off, phases in rows),
                *(off + total for _, off, _, total, _ in partial)], default=1.0) or 1.0
    lo, hi, ticks = _linear_ticks(0.0, span)
    x0, x1 = label_w, width - 70

    def px(t: float) -> float:
        return x0 + (t - lo) / ((hi - lo) or 1.0) * (x1 - x0)

    def bar(name: str, y: float, off: float, phases: list[tuple[str, float, float]]) -> None:
        for phase, start, end in phases:
            label, colour = phase_style(phase)
            x, w = px(off + start), max(px(off + end) - px(off + start), 1.0)
            c.parts.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
                           f'fill="{colour}" data-phase="{escape(phase)}"><title>{escape(name)}: '
                           f"{escape(label)} {start:.1f}–{end:.1f} s ({end - start:.1f} s)</title></rect>")

    for name, off, phases, total, line in partial:
        c.parts.append(f'<text x="{label_w - 8}" y="{top + 15}" text-anchor="end" class="dflash-service" '
                       f'fill="{_FAILED}">{_label(name, label_w - 12)}</text>')
        bar(name, top, off, phases)
        last = phases[-1][2] if phases else 0.0
        if total > last:  # the phase it was in when the wait failed
            x, w = px(off + last), max(px(off + total) - px(off + last), 1.0)
            c.parts.append(f'<rect x="{x:.1f}" y="{top + 3}" width="{w:.1f}" height="{row_h - 8}" '
                           f'fill="#fdecea" stroke="{_FAILED}" stroke-dasharray="3,2" data-phase="stopped">'
                           f"<title>{escape(name)}: {escape(line)}</title></rect>")
        end_x = px(off + total) if total else x0
        c.parts.append(f'<rect x="{end_x:.1f}" y="{top + 1}" width="4" height="{row_h - 4}" fill="{_FAILED}" '
                       f'class="dflash-failed-start"/>')
        head, _, why = line.partition(": ")  # where it stopped, then why, each on a line of its own
        for j, text in enumerate((f"{head}:", why)):
            c.parts.append(f'<text x="{x0}" y="{top + row_h + 6 + 14 * j}" fill="{_FAILED}" '
                           f'class="dflash-stopped">{_label(text, width - x0 - 14)}</text>')
        top += fail_h
    axis_y = top + row_h * len(rows) + 4
    for t in ticks:
        c.parts.append(f'<line x1="{px(t):.1f}" y1="{34 - 4}" x2="{px(t):.1f}" y2="{axis_y}" '
                       f'stroke="#eee"/>')
        c.parts.append(f'<text x="{px(t):.1f}" y="{axis_y + 14}" '
                       f'text-anchor="middle">{escape(_fmt(t))}</text>')
    c.parts.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{axis_y + 30}" text-anchor="middle">seconds since the '
                   "first service's wait began</text>")
    for i, (name, off, phases) in enumerate(rows):
        y = top + i * row_h
        c.parts.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end" class="dflash-service">'
                       f"{_label(name, label_w - 12)}</text>")
        bar(name, y, off, phases)
        total = phases[-1][2]
        c.parts.append(f'<text x="{px(off + total) + 4:.1f}" y="{y + 15}">{total:.1f} s</text>')
    c.parts += _phase_legend(legend_names, axis_y + 46, width)
    return c.svg()


def _phase_legend(names: Sequence[str], top: float, width: int) -> list[str]:
    out = []
    for j, phase in enumerate(names):
        label, colour = phase_style(phase)
        lx = 10 + (j % 3) * (width // 3)
        yy = top + (j // 3) * 18
        out.append(f'<rect x="{lx}" y="{yy - 9}" width="12" height="10" fill="{colour}"/>'
                   f'<text x="{lx + 16}" y="{yy}">{_label(label, width // 3 - 24)}</text>')
    return out


def phase_legend_svg(phases: Iterable[str], *, width: int = 900) -> str | None:
    """The start-up phases' colours, once for a page of timelines; None for no phase."""
    names = phase_order(phases)
    if not names:
        return None
    height = 18 * ((len(names) + 2) // 3) + 8
    c = _Canvas("start-up phases", "", "", width, height)
    c.parts += _phase_legend(names, 16, width)
    # the canvas's own title text would take the first row: keep only its <title> for screen readers
    return c.svg().replace(f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" font-size="13" '
                           'font-weight="bold">start-up phases</text>', "", 1)


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
    summaries = {name: _spread_summary(hosts) for name, hosts in rows.items()}
    label_w = min(max(text_width(name) for name in rows) + 16, width * 0.25)
    # the summaries (which name the slowest host) get the room they need, up to half the width
    right = min(max(text_width(text) for text in summaries.values()) + 20, width * 0.5)
    row_h, top = 30, 34
    height = top + row_h * len(rows) + 44
    c = _Canvas(title, "", "", width, height)
    values = [v for hosts in rows.values() for v in hosts.values()]
    low, high = min(values), max(values)
    positive = [v for v in values if v > 0]
    log = bool(positive) and min(positive) > 0 and high / min(positive) > 30
    c.x0, c.x1 = round(label_w), round(width - right)
    c.set_x(min(positive) if log else 0.0, high if high > low else high + 1.0, log=log)
    ticks = _log_ticks(c.xlo, c.xhi)[2] if log else _linear_ticks(c.xlo, c.xhi)[2]
    axis_y = top + row_h * len(rows) + 2
    for t in ticks:
        c.parts.append(f'<line x1="{c.px(t):.1f}" y1="{top - 4}" x2="{c.px(t):.1f}" y2="{axis_y}" '
                       f'stroke="#eee"/>')
        c.parts.append(f'<text x="{c.px(t):.1f}" y="{axis_y + 14}" '
                       f'text-anchor="middle">{escape(_fmt(t))}</text>')
    c.parts.append(f'<text x="{(c.x0 + c.x1) / 2:.1f}" y="{axis_y + 32}" text-anchor="middle">seconds until '
                   f"ready{' (log scale)' if log else ''}</text>")
    for i, (name, hosts) in enumerate(sorted(rows.items())):
        y = top + i * row_h + row_h / 2
        ordered = sorted(hosts.values())
        median = _median(ordered)
        c.parts.append(f'<text x="{label_w - 8:.1f}" y="{y + 4:.1f}" text-anchor="end">'
                       f"{_label(name, label_w - 12)}</text>")
        c.parts.append(f'<line x1="{c.px(ordered[0]):.1f}" y1="{y:.1f}" x2="{c.px(ordered[-1]):.1f}" '
                       f'y2="{y:.1f}" stroke="#bbb" stroke-width="2"/>')
        for host, value in sorted(hosts.items()):
            c.parts.append(f'<circle cx="{c.px(value):.1f}" cy="{y:.1f}" r="4" fill="{PALETTE[0]}" '
                           f'fill-opacity="0.6"><title>{escape(host)}: {value:.1f} s</title></circle>')
        mx = c.px(median)
        c.parts.append(f'<line x1="{mx:.1f}" y1="{y - 9:.1f}" x2="{mx:.1f}" y2="{y + 9:.1f}" '
                       f'stroke="{PALETTE[1]}" stroke-width="2"/>')
        summary = summaries[name]
        shown = _spread_summary(hosts, room=width - c.x1 - 14)
        tip = f"<title>{escape(summary)}</title>" if shown != summary else ""
        c.parts.append(f'<text x="{c.x1 + 10:.1f}" y="{y + 4:.1f}">{escape(shown)}{tip}</text>')
    return c.svg()


def _median(ordered: Sequence[float]) -> float:
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _spread_summary(hosts: Mapping[str, float], *, room: float | None = None) -> str:
    """'3 hosts: min 2.1, median 2.4, max 6.7 s (slowest-host)'; within `room` px the numbers stay whole and
    the slowest host's name is shortened in the middle."""
    ordered = sorted(hosts.values())
    slowest = max(hosts, key=lambda h: hosts[h])
    numbers = (f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}: min {_fmt(ordered[0])}, median "
               f"{_fmt(_median(ordered))}, max {_fmt(ordered[-1])} s")
    if room is not None:
        slowest = _fit(slowest, room - text_width(numbers + " ()"))
    return f"{numbers} ({slowest})"
