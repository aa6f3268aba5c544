"""One host's cold start as a timeline: its services side by side on one clock, each bar cut into its phases;
a service that never became ready drawn first, up to where it stopped, with why (wrapped, never cut)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from xml.sax.saxutils import escape

from pytest_dflash.report.plots.canvas import (
    FAILED,
    Canvas,
    linear_ticks,
    svg_label,
    vertical_grid,
    wrap_lines,
)
from pytest_dflash.report.plots.phases import (
    cold_start_phases,
    phase_order,
    phase_style,
    seconds_of,
    stopped_in,
    stopped_phases,
)


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
              if (w := seconds_of(r.get("waited_from"))) is not None]
    t0 = min(starts) if starts else 0.0

    def offset(facts: Mapping[str, object]) -> float:
        waited = seconds_of(facts.get("waited_from"))
        return (waited - t0) if waited is not None else 0.0

    for name, ready in services.items():
        if phases := cold_start_phases(ready):
            rows.append((name, offset(ready), phases))
    for name, why in failed.items():
        facts = stopped.get(name) or {}
        phases = stopped_phases(facts)
        total = seconds_of(facts.get("total_s")) or 0.0
        where = f" (stopped {stopped_in(facts)}, after {total:.1f} s)" if facts else ""
        partial.append((name, offset(facts), phases, total, f"never ready{where}: {why}"))
    if not rows and not partial:
        return None
    label_w, row_h, top = 150, 26, 34
    # a failed row: its bar, then where it stopped, then why, wrapped (never cut: its end is the news)
    texts = {name: [f"{head}:", *wrap_lines(why, width - label_w - 14)]
             for name, _, _, _, line in partial for head, _, why in [line.partition(": ")]}
    drawn = [*(phases for _, _, phases in rows), *(phases for _, _, phases, _, _ in partial)]
    legend_names = phase_order(ph for phases in drawn for ph, _, _ in phases) if legend else []
    height = (top + row_h * len(rows) + sum(row_h + 4 + 14 * len(t) for t in texts.values()) + 40
              + 18 * ((len(legend_names) + 2) // 3) + (0 if legend else -4))
    c = Canvas(title, "", "", width, height)
    span = max([*(off + phases[-1][2] for _, off, phases in rows),
                *(off + total for _, off, _, total, _ in partial)], default=1.0) or 1.0
    lo, hi, ticks = linear_ticks(0.0, span)
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
                       f'fill="{FAILED}">{svg_label(name, label_w - 12)}</text>')
        bar(name, top, off, phases)
        last = phases[-1][2] if phases else 0.0
        if total > last:  # the phase it was in when the wait failed
            x, w = px(off + last), max(px(off + total) - px(off + last), 1.0)
            c.parts.append(f'<rect x="{x:.1f}" y="{top + 3}" width="{w:.1f}" height="{row_h - 8}" '
                           f'fill="#fdecea" stroke="{FAILED}" stroke-dasharray="3,2" data-phase="stopped">'
                           f"<title>{escape(name)}: {escape(line)}</title></rect>")
        end_x = px(off + total) if total else x0
        c.parts.append(f'<rect x="{end_x:.1f}" y="{top + 1}" width="4" height="{row_h - 4}" fill="{FAILED}" '
                       f'class="dflash-failed-start"/>')
        for j, text in enumerate(texts[name]):
            c.parts.append(f'<text x="{x0}" y="{top + row_h + 6 + 14 * j}" fill="{FAILED}" '
                           f'class="dflash-stopped" stroke="#fff" stroke-width="3" paint-order="stroke">'
                           f"{escape(text)}</text>")  # a white halo: readable over the grid lines
        top += row_h + 4 + 14 * len(texts[name])
    axis_y = top + row_h * len(rows) + 4
    c.parts += vertical_grid(px, ticks, 34 - 4, axis_y)
    c.parts.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{axis_y + 30}" text-anchor="middle">seconds since the '
                   "first service's wait began</text>")
    for i, (name, off, phases) in enumerate(rows):
        y = top + i * row_h
        c.parts.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end" class="dflash-service">'
                       f"{svg_label(name, label_w - 12)}</text>")
        bar(name, y, off, phases)
        total = phases[-1][2]
        c.parts.append(f'<text x="{px(off + total) + 4:.1f}" y="{y + 15}">{total:.1f} s</text>')
    c.parts += phase_legend(legend_names, axis_y + 46, width)
    return c.svg()


def phase_legend(names: Sequence[str], top: float, width: int) -> list[str]:
    out = []
    for j, phase in enumerate(names):
        label, colour = phase_style(phase)
        lx = 10 + (j % 3) * (width // 3)
        yy = top + (j // 3) * 18
        out.append(f'<rect x="{lx}" y="{yy - 9}" width="12" height="10" fill="{colour}"/>'
                   f'<text x="{lx + 16}" y="{yy}">{svg_label(label, width // 3 - 24)}</text>')
    return out


def phase_legend_svg(phases: Iterable[str], *, width: int = 900) -> str | None:
    """The start-up phases' colours, once for a page of timelines; None for no phase."""
    names = phase_order(phases)
    if not names:
        return None
    height = 18 * ((len(names) + 2) // 3) + 8
    c = Canvas("start-up phases", "", "", width, height)
    c.parts += phase_legend(names, 16, width)
    # the canvas's own title text would take the first row: keep only its <title> for screen readers
    return c.svg().replace(f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" font-size="13" '
                           'font-weight="bold">start-up phases</text>', "", 1)


