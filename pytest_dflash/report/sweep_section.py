"""The HTML report's "dflash load sweep" section: per host that swept in this run, where speculation stops
paying and up to what load the SLOs hold, in words, over the sweep's pictures (report/plots/sweep.py), drawn
from the curve the perf layer wrote (`<report dir>/perf/<host>/sweep.json`)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_dflash.load.curve import ServiceCurve, SweepCurve

__all__ = ["host_sweep_block", "max_within_slo", "sweep_section", "swept_in_run"]

OUTCOME_COLOURS = {"pass": "#1b5e20", "fail": "#8b1a1a", "inconclusive": "#7a3e00"}  # >= 7:1 on white
# pytest-html greys its headings (2.9:1): the section sets its own dark text
CSS = ("<style>div.dflash-sweep{margin:4px 0 18px;color:#1a1a1a}div.dflash-sweep h3,div.dflash-sweep ul"
       "{margin:4px 0;color:#1a1a1a}"
       "div.dflash-sweep-plots{display:flex;flex-wrap:wrap;gap:8px}</style>")


def swept_in_run(metrics: Mapping[str, Any]) -> bool:
    """Did this run sweep the host (its verdict's `perf.<svc>.sweep.*` numbers)? A sweep.json left in the
    report dir by an earlier run is not this run's picture."""
    return any(key.startswith("perf.") and ".sweep." in key for key in metrics)


def max_within_slo(service: ServiceCurve) -> int | None:
    """The highest level within the SLOs, every lower level passing too (gates.py's
    max_concurrency_within_slo); None when the first level does not pass."""
    highest = None
    for point in service.levels:
        if point.slo_outcome != "pass":
            break
        highest = point.concurrency
    return highest


def _summary(curve: SweepCurve) -> list[str]:
    lines = []
    for speedup in curve.speedups:
        if speedup.crossover_text:
            lines.append(f"crossover: {speedup.crossover_text}")
        else:
            paid = [p.concurrency for p in speedup.points if p.ratio is not None]
            lines.append(f"no crossover: {speedup.service} is not confidently slower than {speedup.versus} "
                         f"at any level measured (up to concurrency {max(paid) if paid else '?'})")
    for service in curve.services:
        if service.slo:
            lines.append(f"{service.service}: {_slo_reach(service)}")
    return lines


def _slo_reach(service: ServiceCurve) -> str:
    """'within the SLOs up to concurrency 4; concurrency 8 broke them' / '…; concurrency 1 inconclusive (the
    SLOs not confidently met)' / 'within the SLOs at every level (up to concurrency 16)'."""
    within = max_within_slo(service)
    reach = (f"within the SLOs up to concurrency {within}" if within is not None
             else "no level confidently within the SLOs")
    stop = next((p for p in service.levels if p.slo_outcome != "pass"), None)
    if stop is None:
        return f"within the SLOs at every level (up to concurrency {within})"
    if not stop.measured:
        return f"{reach}; concurrency {stop.concurrency} {stop.why or 'not run'}"
    if stop.slo_outcome == "fail":
        return f"{reach}; concurrency {stop.concurrency} broke them"
    return f"{reach}; concurrency {stop.concurrency} {stop.slo_outcome} (the SLOs not confidently met)"


def host_sweep_block(curve: SweepCurve) -> str:
    """One host's sweep: the crossover and the SLO reach in words, the gates' outcomes, then the pictures."""
    from pytest_dflash.report.plots.sweep import sweep_plots

    items = [f"<li>{html.escape(line)}</li>" for line in _summary(curve)]
    items += [f'<li><b style="color:{OUTCOME_COLOURS.get(g.outcome, "#1a1a1a")}">'
              f"{html.escape(g.outcome)}</b> {html.escape(g.service)}: {html.escape(g.message)}</li>"
              for g in curve.gates]
    levels = ", ".join(str(level) for level in curve.levels)
    head = (f"<h3>{html.escape(curve.host)}: concurrency {html.escape(levels)}"
            + (f" ({curve.spent_s:.0f} s of a {curve.budget_s:.0f} s budget)" if curve.budget_s else "")
            + "</h3>")
    plots = "".join(sweep_plots(curve).values())
    return (f'<div class="dflash-sweep" data-host="{html.escape(curve.host)}">{head}<ul>{"".join(items)}</ul>'
            f'<div class="dflash-sweep-plots">{plots}</div></div>')


def sweep_section(report_dir: Path, metrics: Mapping[str, Mapping[str, Any]]) -> str:
    """Every host of `metrics` ({host: its verdict's metrics}) that swept in this run; '' when none did."""
    from pytest_dflash.config.targets import file_name

    blocks = []
    for host, numbers in sorted(metrics.items()):
        if not swept_in_run(numbers):
            continue
        path = report_dir / "perf" / file_name(host) / "sweep.json"
        try:
            curve = SweepCurve.from_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # the picture is missing, and says why
            blocks.append(f'<div class="dflash-sweep" data-host="{html.escape(host)}"><h3>{html.escape(host)}'
                          f"</h3><p>could not draw the sweep: {html.escape(path.name)}: "
                          f"{html.escape(str(exc)[:300])}</p></div>")
            continue
        blocks.append(host_sweep_block(curve))
    if not blocks:
        return ""
    return "<h2>dflash load sweep</h2>" + CSS + "".join(blocks)
