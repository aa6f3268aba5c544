"""fleet-summary.html: one self-contained page (inline CSS and a few lines of JS, no external assets).

Top to bottom: totals and gate (and, at the end of one shard, the hosts in other shards); the host x layer
matrix (failing hosts first, host names unwrapped, each failing cell names its diagnosis and links to the
host's details; where speculation stops paying on the host: fleet/sweeps.py); trend vs the previous run
(new failures, fixed, disappeared, perf regressions, a crossover that moved); diagnoses across the fleet; the
readiness spread (each service's seconds until ready across the hosts, as inline SVG); one section per failing
host (failures with diagnosis and remedy, blocked roots, failing since, what changed since its last good
verdict, perf deltas, services); passing hosts folded at the end.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from pytest_dflash.fleet.sweeps import crossover_line, speculation_lines
from pytest_dflash.fleet.values import measurements, safe_name
from pytest_dflash.report.gpus import gpu_matrix_table
from pytest_dflash.report.perf_table import perf_table, rows_from_metrics
from pytest_dflash.report.ranks import rank_lines
from pytest_dflash.scrub.terminal import terminal_safe

COLOURS = {"passed": "#2e7d32", "failed": "#c62828", "blocked": "#ef6c00", "skipped": "#757575",
           "not-run": "#bdbdbd"}
CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em;color:#222}
h1{margin:0 0 .2em}h2{margin:1.4em 0 .4em;border-bottom:1px solid #ddd}h3{margin:1em 0 .3em}
.meta{color:#555}.pass{color:#2e7d32;font-weight:600}.fail{color:#c62828;font-weight:600}
table{border-collapse:collapse;margin:.4em 0}th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f5f5f5;position:sticky;top:0}
td.o{color:#fff;text-align:center;min-width:5.5em}td.o a{color:#fff}td.o small{display:block;opacity:.9}
""" + "".join(f"td.o-{name}{{background:{colour}}}" for name, colour in COLOURS.items()) + """
td.o-not-run{color:#555}td.o-not-run a{color:#555}
.diag{border-left:4px solid #c62828;background:#fff3f3;padding:4px 8px;margin:4px 0}
.remedy{color:#333}.muted{color:#777}code,pre{font:12px/1.35 ui-monospace,Menlo,Consolas,monospace}
pre{white-space:pre-wrap;background:#fafafa;border:1px solid #eee;padding:4px 6px;margin:2px 0}
article{border:1px solid #e0e0e0;border-radius:4px;padding:.2em 1em 1em;margin:1em 0}
article:target{box-shadow:0 0 0 3px #ffb300}.bad{color:#c62828;font-weight:600}.good{color:#2e7d32}
.worse{color:#c62828}
#controls{margin:.5em 0}#matrix td:first-child{white-space:nowrap}
"""
SCRIPT = """
(function(){var f=document.getElementById('filter'),c=document.getElementById('only-failing');
function apply(){var q=f.value.toLowerCase();\
document.querySelectorAll('#matrix tbody tr').forEach(function(r){
var ok=r.dataset.host.toLowerCase().indexOf(q)>=0&&(!c.checked||r.dataset.verdict==='fail');
r.style.display=ok?'':'none';});}f.addEventListener('input',apply);c.addEventListener('change',apply);})();
"""


def e(value: Any) -> str:
    """HTML-escaped, and its control characters written out (html.escape leaves ESC and BEL as they are)."""
    return html.escape(terminal_safe("" if value is None else str(value)), quote=True)


def layer_header(layer: str) -> str:
    """A layer's column header: "host layer" for the host layer, which a bare "host" would make a second
    column named like the host names' one."""
    return "host layer" if layer == "host" else layer


def anchor(host: str) -> str:
    return "h-" + safe_name(host)


def render_html(summary: Mapping[str, Any]) -> str:
    hosts: Mapping[str, Mapping[str, Any]] = summary["hosts"]
    layers: list[str] = list(summary["layers"])
    extra = sorted({layer for entry in hosts.values() for layer in entry["layers"] if layer not in layers})
    layers += extra
    shown = [layer for layer in layers
             if any(e_["layers"].get(layer, "not-run") != "not-run" for e_ in hosts.values())]
    shown = shown or layers
    totals = summary["totals"]
    out: list[str] = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>pytest-dflash fleet: {totals['pass']}/{totals['hosts']} pass</title>",
                      f"<style>{CSS}</style></head><body>", "<h1>pytest-dflash fleet summary</h1>"]
    out.append(f'<p class="meta">generated {e(summary["generated"])} from {len(summary["runs"])} run(s) '
               f'({e(", ".join(summary["run_ids"]))}); <b>{totals["hosts"]}</b> hosts: '
               f'<span class="pass">{totals["pass"]} pass</span>, '
               f'<span class="fail">{totals["fail"]} fail</span>'
               + "".join(f', <span class="fail">{totals[v]} {v}</span>' for v in ("partial", "interrupted")
                         if totals.get(v))
               + (f'; excluded: {e(", ".join(summary["excluded"]))}'
                  if summary.get("excluded") else "") + "</p>")
    gate = summary.get("gate")
    if gate:
        state = '<span class="pass">PASSED</span>' if gate["passed"] else '<span class="fail">FAILED</span>'
        links = "".join(f' <a href="#{anchor(h)}">{e(h)}</a>' for h in sorted(gate["failing"]))
        out.append(f"<p>gate <code>{e(','.join(gate['layers']))}</code>: {state}"
                   + (f" — not passed on:{links}" if links else "") + "</p>")
    if elsewhere := list(summary.get("in_another_shard") or ()):
        out.append(f'<p class="meta">{len(elsewhere)} more host(s) in another shard: '
                   f'{e(", ".join(elsewhere))} (the merge of all shards judges the whole fleet)</p>')
    out += _matrix(hosts, shown)  # before anything long: the first screen answers "which host, why"
    out += _trend(summary.get("trend"))
    out += _diagnoses(summary.get("diagnoses") or {})
    out += _readiness(hosts)
    out += _perf_table(hosts)
    failing = [(name, entry) for name, entry in hosts.items() if entry["verdict"] != "pass"]
    if failing:
        out.append(f"<h2>Failing hosts ({len(failing)})</h2>")
        for name, entry in failing:
            out += _host_section(name, entry)
    passing = [(name, entry) for name, entry in hosts.items() if entry["verdict"] == "pass"]
    if passing:
        out.append(f"<h2>Passing hosts ({len(passing)})</h2>"
                   "<details><summary>services, readiness, accept length"
                   "</summary>")
        for name, entry in passing:
            out.append(f'<article id="{anchor(name)}"><h3>{e(name)} <span class="pass">PASS</span></h3>')
            out += _services(entry)
            out += _perf_delta(entry)
            out.append("</article>")
        out.append("</details>")
    out.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(out) + "\n"


def _trend(trend: Mapping[str, Any] | None) -> list[str]:
    if not trend:
        return ['<p class="muted">No previous summary: no trend (the next run compares with this one).</p>']
    previous = trend["previous"]
    out = [f"<h2>Since the previous run</h2><p class=\"meta\">compared with the run(s) "
           f"{e(', '.join(previous.get('run_ids') or []))} finished {e(previous.get('finished'))} "
           f"({previous.get('hosts')} hosts; summary of {e(previous.get('generated'))})</p><ul>"]
    if trend["new_failures"]:
        items = ", ".join(f'<a href="#{anchor(f["host"])}">{e(f["host"])}</a> ({e(", ".join(f["layers"]))}'
                          + (f": {e(', '.join(f['diagnosis']))}" if f["diagnosis"] else "") + ")"
                          + (" <i>new host</i>" if f["was"] == "absent" else "")
                          for f in trend["new_failures"])
        out.append(f'<li class="bad"><b>new failures ({len(trend["new_failures"])})</b>: {items}</li>')
    if trend["fixed"]:
        out.append(f'<li class="good"><b>fixed ({len(trend["fixed"])})</b>: '
                   + ", ".join(f'{e(f["host"])} ({e(", ".join(f["layers"]))})'
                               for f in trend["fixed"]) + "</li>")
    if trend["still_failing"]:
        out.append(f"<li><b>still failing ({len(trend['still_failing'])})</b>: "
                   + ", ".join(f'<a href="#{anchor(h)}">{e(h)}</a>'
                               for h in trend["still_failing"]) + "</li>")
    if trend["disappeared"]:
        out.append(f'<li class="bad"><b>disappeared ({len(trend["disappeared"])})</b> (in the previous run, '
                   f'no verdict now): {e(", ".join(trend["disappeared"]))}</li>')
    if trend["new_hosts"]:
        out.append(f"<li><b>new hosts ({len(trend['new_hosts'])})</b>: "
                   f"{e(', '.join(trend['new_hosts']))}</li>")
    if not any(trend[k] for k in ("new_failures", "fixed", "still_failing", "disappeared", "new_hosts")):
        out.append("<li>no change in host verdicts</li>")
    out += [f'<li class="{"bad" if c["direction"] == "worse" else "good"}">{e(crossover_line(c))}'
            + (f' <span class="meta">(good runs: {e(", ".join(h["crossover"] for h in c["history"]))})</span>'
               if c.get("history") else "") + "</li>" for c in trend.get("crossover") or ()]
    out.append("</ul>")
    perf = trend["perf"]
    if perf:
        out.append(f"<h3>Perf deltas (|change| ≥ {trend['perf_threshold_pct']:g}%)</h3>"
                   + (f'<p class="meta">regression: {e(trend["perf_rule"])}</p>'
                      if trend.get("perf_rule") else "")
                   + "<table><tr><th>host</th><th>number</th><th>previous</th><th>current</th><th>change</th>"
                   "<th>judged</th></tr>")
        for item in perf[:200]:
            css, pct = _delta_cells(item)
            out.append(f'<tr><td><a href="#{anchor(item["host"])}">{e(item["host"])}</a></td>'
                       f'<td>{e(item["metric"])}</td><td>{item["previous"]:g}</td>'
                       f'<td>{item["current"]:g}</td><td class="{css}">{pct}</td>'
                       f'<td class="{css}">{e(item.get("rule") or "")}</td></tr>')
        out.append("</table>" + (f'<p class="muted">{len(perf) - 200} more in fleet-summary.json</p>'
                                 if len(perf) > 200 else ""))
    return out


def _readiness(hosts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each service's readiness seconds across hosts (a dot per host, the median marked, the slowest
    named)."""
    from pytest_dflash.report.plots import readiness_spread_svg

    spread: dict[str, dict[str, float]] = {}
    for name, entry in hosts.items():
        for service, facts in (entry.get("services") or {}).items():
            if isinstance(facts.get("ready_s"), int | float):
                spread.setdefault(service, {})[name] = float(facts["ready_s"])
    svg = readiness_spread_svg(spread)
    if svg is None:
        return []
    # Inline SVG needs no namespace in HTML (the parser knows <svg>): the page names no URL at all.
    svg = svg.replace(' xmlns="http://www.w3.org/2000/svg"', "", 1)
    return ['<h2>Readiness across hosts</h2><div class="readiness-spread">', svg, "</div>"]


def _perf_table(hosts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every host's perf services in one table, failing hosts first."""
    rows = [row for name, entry in hosts.items()
            for row in rows_from_metrics(name, entry.get("metrics") or {},
                                         {s: str(f.get("algorithm") or "")
                                          for s, f in (entry.get("services") or {}).items()},
                                         failing=entry["verdict"] != "pass")]
    table = perf_table(rows)
    return ["<h2>Perf across services</h2>", table] if table else []


def _diagnoses(diagnoses: Mapping[str, Mapping[str, Any]]) -> list[str]:
    if not diagnoses:
        return []
    out = ["<h2>Diagnoses across the fleet</h2><table><tr><th>diagnosis</th><th>hosts</th></tr>"]
    for ident, item in diagnoses.items():
        hosts = ", ".join(f'<a href="#{anchor(h)}">{e(h)}</a>' for h in item["hosts"][:50])
        more = f" … (+{len(item['hosts']) - 50})" if len(item["hosts"]) > 50 else ""
        out.append(f"<tr><td><code>{e(ident)}</code><br>{e(item['title'])}</td><td>{len(item['hosts'])}: "
                   f"{hosts}{more}</td></tr>")
    out.append("</table>")
    return out


def _matrix(hosts: Mapping[str, Mapping[str, Any]], layers: list[str]) -> list[str]:
    out = ['<h2>Hosts × layers</h2><div id="controls"><label><input type="checkbox" id="only-failing"> '
           'failing hosts only</label> <input id="filter" placeholder="filter hosts" size="24"></div>',
           '<table id="matrix"><thead><tr><th>host</th><th>verdict</th>'
           + "".join(f"<th>{e(layer_header(layer))}</th>" for layer in layers)
           + "<th>where speculation stops paying</th><th>failing since</th></tr></thead><tbody>"]
    order = sorted(hosts.items(), key=lambda kv: (kv[1]["verdict"] != "fail", kv[0]))
    for name, entry in order:
        verdict = entry["verdict"]
        cells = []
        for layer in layers:
            outcome = entry["layers"].get(layer, "not-run")
            # root cause first, as each failure lists them (never alphabetical: a consequence would lead)
            ids = list(dict.fromkeys(d["id"] for f in entry["failures"] if f["layer"] == layer
                                     for d in f["diagnosis"]))
            titles = list(dict.fromkeys(d["title"] for f in entry["failures"] if f["layer"] == layer
                                        for d in f["diagnosis"]))
            messages = [f["message"] for f in entry["failures"] if f["layer"] == layer][:2]
            if outcome == "blocked":
                messages = [b["message"] for b in entry["blocked"] if layer in b.get("layers", [])][:1]
            tip = " | ".join(titles or messages)
            label = e(outcome)
            if outcome in ("failed", "blocked"):
                label = f'<a href="#{anchor(name)}">{label}</a>'
            small = f"<small>{e(', '.join(ids))}</small>" if ids else ""
            cells.append(f'<td class="o o-{e(outcome)}" title="{e(tip)}">{label}{small}</td>')
        since = e(entry.get("failing_since") or "")
        speculation = "<br>".join(map(e, speculation_lines(entry)))
        out.append(f'<tr data-host="{e(name)}" data-verdict="{e(verdict)}">'
                   f'<td><a href="#{anchor(name)}">{e(name)}</a></td>'
                   f'<td class="{e(verdict)}">{e(verdict.upper())}</td>{"".join(cells)}'
                   f'<td class="sweep">{speculation}</td><td>{since}</td></tr>')
    out.append("</tbody></table>")
    return out


def _host_section(name: str, entry: Mapping[str, Any]) -> list[str]:
    out = [f'<article id="{anchor(name)}"><h3>{e(name)} <span class="fail">FAIL</span></h3>',
           f'<p class="meta">run {e(entry["run_id"])}, finished {e(entry["finished"])}; profile '
           f'<code>{e(entry.get("profile"))}</code>; connection <code>{e(entry.get("connection"))}</code><br>'
           f'failing since <b>{e(entry.get("failing_since"))}</b>; last good: '
           + (f'run {e(entry["last_good"].get("run_id"))} ({e(entry["last_good"].get("finished"))})'
              if entry.get("last_good") else "none on record") + "</p>"]
    for failure in entry["failures"]:
        out.append(f"<div><b>{e(failure['layer'])}</b> <code>{e(failure['test'])}</code> "
                   f"({e(failure['phase'])})<pre>{e(failure['message'])}</pre>")
        for diagnosis in failure["diagnosis"]:
            subject = f'{e(diagnosis["subject"])}: ' if diagnosis.get("subject") else ""
            out.append(f'<div class="diag"><b>[{e(diagnosis["id"])}]</b> {subject}{e(diagnosis["title"])}'
                       + (f'<div class="remedy">remedy: {e(diagnosis["remedy"])}</div>'
                          if diagnosis["remedy"] else "")
                       + "</div>")
        out.append("</div>")
    out += [f'<p class="rank"><b>rank</b> {e(line)}</p>' for line in rank_lines(entry.get("services") or {})]
    for blocked in entry["blocked"]:
        out.append(f'<p class="muted">{blocked["count"]} test(s) blocked '
                   f'({e(", ".join(blocked["layers"]))}): {e(blocked["message"])}</p>')
    out.append(gpu_matrix_table(name, entry.get("gpu_matrix") or {}))
    out += _changed(entry.get("changed"))
    out += _perf_delta(entry)
    out += _services(entry)
    for note in entry.get("notes", []):
        out.append(f'<p class="muted">note: {e(note)}</p>')
    out.append("</article>")
    return out


def _changed(changed: Mapping[str, Any] | None) -> list[str]:
    if changed is None:
        return ['<p class="muted">What changed: no good verdict of this host on record.</p>']
    since = changed["since"]
    head = (f"<h4>What changed since the last good run {e(since.get('run_id'))} ({e(since.get('finished'))})"
            f" — compared: {e(changed['basis'])}</h4>")
    out = [head]
    for note in [*(changed.get("not_compared") or ()), *([changed["note"]] if changed.get("note") else [])]:
        out.append(f'<p class="muted">not compared: {e(note)}</p>')
    if not changed["changes"]:
        out.append("<p>nothing that the verdicts record changed (look at the failure and the diagnosis).</p>")
        return out
    out.append("<table><tr><th>kind</th><th>what</th><th>last good</th><th>now</th></tr>")
    for change in changed["changes"]:
        out.append(f"<tr><td>{e(change['category'])}</td><td><code>{e(change['key'])}</code></td>"
                   f"<td>{e(_value(change['before']))}</td><td>{e(_value(change['after']))}</td></tr>")
    out.append("</table>")
    if changed["count"] > len(changed["changes"]):
        out.append(f'<p class="muted">{changed["count"] - len(changed["changes"])} more changes '
                   f'not shown</p>')
    return out


def _value(value: Any) -> str:
    return "absent" if value is None else str(value)


def _perf_delta(entry: Mapping[str, Any]) -> list[str]:
    deltas: Mapping[str, Mapping[str, Any]] = entry.get("perf_delta") or {}
    if not deltas:
        return []
    out = ["<table><tr><th>number</th><th>previous run</th><th>this run</th>"
           "<th>change</th><th>judged</th></tr>"]
    for key, item in deltas.items():
        css, pct = _delta_cells(item)
        out.append(f'<tr><td>{e(key)}</td><td>{item["previous"]:g}</td><td>{item["current"]:g}</td>'
                   f'<td class="{css}">{pct}</td><td class="{css}">{e(item.get("rule") or "")}</td></tr>')
    out.append("</table>")
    return out


def _delta_cells(item: Mapping[str, Any]) -> tuple[str, str]:
    """(css class, shown change) of a perf delta: red when worse (bold when a regression), green when better,
    by the number's direction (tok/s and accept length up, latencies down), with the word beside it."""
    direction = item.get("direction")
    css = ("bad" if item["regression"] else "worse" if direction == "worse" else "good" if direction
           else "muted")
    pct = f"{item['pct']:+.1f}%" if item["pct"] is not None else "new"
    return css, f"{pct} {direction}" if direction else pct


def _services(entry: Mapping[str, Any]) -> list[str]:
    services: Mapping[str, Mapping[str, Any]] = entry.get("services") or {}
    metrics: Mapping[str, float] = entry.get("metrics") or {}
    out: list[str] = []
    if services:
        out.append("<table><tr><th>service</th><th>algorithm</th><th>version</th><th>ready (s)</th>"
                   "<th>accept length</th></tr>")
        for name, facts in services.items():
            ready = facts.get("ready_s")
            accept = facts.get("accept_length")
            out.append(f"<tr><td>{e(name)}</td><td>{e(facts.get('algorithm'))}</td><td>{e(facts.get('version'))}</td>"
                       f"<td>{'' if ready is None else f'{ready:.2f}'}</td>"
                       f"<td>{'' if accept is None else f'{accept:.2f}'}</td></tr>")
        out.append("</table>")
    measured = measurements(metrics)  # thresholds, settings and intervals stay in fleet-summary.json
    if measured:
        out.append("<table><tr><th>measured</th><th>value</th></tr>"
                   + "".join(f"<tr><td>{e(k)}</td><td>{v:g}</td></tr>"
                             for k, v in measured.items()) + "</table>")
    return out
