"""Writing a fleet summary out: fleet-summary.json, fleet-summary.html, fleet-junit.xml and fleet.prom
(:func:`write_outputs`), the whole merge from verdicts to files and history (:func:`summarize`), and the
terminal lines (:func:`headline`).

Used by `pytest-dflash merge` (pytest_dflash.cli) and at the end of every run (pytest_dflash.fleet.hooks).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_dflash.files import atomic_write
from pytest_dflash.fleet.html import render_html
from pytest_dflash.fleet.junit import render_junit
from pytest_dflash.fleet.prometheus import fleet_exposition, write_textfile
from pytest_dflash.fleet.summary import build_summary, read_summary
from pytest_dflash.fleet.sweeps import crossover_line
from pytest_dflash.fleet.trend import record_good_runs, trend_line
from pytest_dflash.fleet.verdicts import History, LoadedVerdict

SUMMARY_JSON = "fleet-summary.json"
SUMMARY_HTML = "fleet-summary.html"
JUNIT_XML = "fleet-junit.xml"
PROMETHEUS = "fleet.prom"


@dataclass
class Outputs:
    summary_json: Path
    summary_html: Path
    junit_xml: Path
    prometheus: list[Path]
    history: list[Path]

    def all(self) -> list[Path]:
        return [self.summary_json, self.summary_html, self.junit_xml, *self.prometheus]


def write_summary_files(summary: Mapping[str, Any], out_dir: Path) -> None:
    """fleet-summary.json, fleet-summary.html and fleet-junit.xml (not the Prometheus textfiles)."""
    atomic_write(out_dir / SUMMARY_JSON, json.dumps(summary, indent=1, default=str) + "\n")
    atomic_write(out_dir / SUMMARY_HTML, render_html(summary))
    atomic_write(out_dir / JUNIT_XML, render_junit(summary))


def write_outputs(summary: Mapping[str, Any], out_dir: Path, *, prometheus: Path | None = None) -> Outputs:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = Outputs(out_dir / SUMMARY_JSON, out_dir / SUMMARY_HTML, out_dir / JUNIT_XML,
                    [out_dir / PROMETHEUS], [])
    write_summary_files(summary, out_dir)
    text = fleet_exposition(summary)
    write_textfile(paths.prometheus[0], text)
    if prometheus is not None and prometheus.resolve() != paths.prometheus[0].resolve():
        write_textfile(prometheus, text)
        paths.prometheus.append(prometheus)
    return paths


def summarize(inputs: Sequence[LoadedVerdict], out_dir: Path, *, previous_path: Path | None,
              history_dir: Path | None, gate_layers: Sequence[str] = (), excluded: Sequence[str] = (),
              exclude_patterns: Sequence[str] = (), prometheus: Path | None = None,
              perf_threshold_pct: float = 5.0, one_shard: bool = False) -> tuple[dict[str, Any], Outputs]:
    """Build the summary, write every output, then record this run's good verdicts in the history."""
    previous = read_summary(previous_path) if previous_path is not None else None
    history = History(history_dir) if history_dir is not None else None
    summary = build_summary(inputs, previous=previous,
                            previous_source=str(previous_path) if previous_path else None, history=history,
                            gate_layers=gate_layers, excluded=excluded, exclude_patterns=exclude_patterns,
                            perf_threshold_pct=perf_threshold_pct, one_shard=one_shard)
    outputs = write_outputs(summary, out_dir, prometheus=prometheus)
    if history is not None:
        outputs.history = history.record(inputs)
        outputs.history += record_good_runs(history.root, summary["hosts"])
    return summary, outputs


def headline(summary: Mapping[str, Any], *, gate_line: bool = True) -> list[str]:
    """A few lines for a terminal: totals, gate, trend, and what changed on failing hosts. `gate_line=False`
    at the end of a run: its dflash verdict section already has the gate's one line."""
    totals = summary["totals"]
    incomplete = [f"{totals[v]} {v}" for v in ("partial", "interrupted") if totals.get(v)]
    if totals["hosts"] == 1:  # "0/1 hosts pass" on a one-host run: say which host and how it ended
        ((name, entry),) = summary["hosts"].items()
        first = f"fleet: one host, {name}: {str(entry['verdict']).upper()}"
    else:
        first = (f"fleet: {totals['pass']}/{totals['hosts']} hosts pass"
                 + (f" ({', '.join(incomplete)})" if incomplete else ""))
    elsewhere = list(summary.get("in_another_shard") or ())
    if elsewhere:  # the end of one shard: the fleet's verdict is the merge's
        first += (f"; {len(elsewhere)} host{'s' if len(elsewhere) != 1 else ''} in another shard "
                  f"({', '.join(elsewhere[:5])}{', …' if len(elsewhere) > 5 else ''}): the merge judges "
                  "the fleet")
    lines = [first
             + (f"; excluded: {', '.join(summary['excluded'])}" if summary.get("excluded") else "")]
    gate = summary.get("gate")
    if gate and gate_line:
        verdict = ("PASSED" if gate["passed"]
                   else f"FAILED on {', '.join(sorted(gate['failing'])) or 'no hosts'}")
        lines.append(f"gate {','.join(gate['layers'])}: {verdict}")
    trend = summary.get("trend")
    if trend:
        previous = trend["previous"].get("finished") or "the previous run"
        if trend["new_failures"]:
            lines.append(f"new failures since {previous}: " + "; ".join(
                f"{f['host']} "
                f"({', '.join(f['layers'])}{': ' + ', '.join(f['diagnosis']) if f['diagnosis'] else ''})"
                for f in trend["new_failures"][:10]) + (" …" if len(trend["new_failures"]) > 10 else ""))
        if trend["fixed"]:
            lines.append("fixed: " + ", ".join(f["host"] for f in trend["fixed"][:20]))
        if trend["disappeared"]:
            lines.append("disappeared (no verdict this time): " + ", ".join(trend["disappeared"][:20]))
        regressions = [p for p in trend["perf"] if p["regression"]]
        lines += [crossover_line(c) for c in trend.get("crossover") or ()][:10]
        if regressions:
            lines.append("perf regressions: " + "; ".join(trend_line(p) for p in regressions[:5]))
    shown = 0
    for name, entry in summary["hosts"].items():
        if entry["verdict"] != "fail" or shown >= 10:
            continue
        shown += 1
        changed = entry.get("changed")
        since = f"failing since {entry['failing_since']}"
        if changed is None:
            lines.append(f"{name}: {since}; no good verdict on record to compare with")
        elif not changed["count"]:
            lines.append(f"{name}: {since}; nothing changed since its last good run "
                         f"{changed['since']['run_id']}")
        else:
            parts = [f"{c['key'].rsplit('.', 1)[-1]} {_short(c['before'])} -> {_short(c['after'])}"
                     for c in changed["changes"][:4]]
            more = f" (+{changed['count'] - 4} more)" if changed["count"] > 4 else ""
            lines.append(f"{name}: {since}; changed since last good run {changed['since']['run_id']}: "
                         + "; ".join(parts) + more)
        if changed is not None:
            lines += [f"{name}: not compared: {note}" for note in changed.get("not_compared") or ()]
    return lines


def _short(value: Any) -> str:
    text = "absent" if value is None else str(value)
    if len(text) <= 40:
        return text
    cut = max(text.rfind(" ", 0, 38), text.rfind("/", 0, 38) + 1, text.rfind("-", 0, 38) + 1)
    return text[:cut if cut > 10 else 37].rstrip() + "…"  # after a word where one ends in reach
