"""The HTML report's first screen: what an on-call engineer opening it at 3 a.m. reads before scrolling — the
run's verdict in its colour, the gate's result and why, each failing host's first diagnosis, and what changed
since its last good run — placed above pytest-html's Environment table, which is collapsed (a click opens it).

pytest-html renders its summary hook's HTML under "Summary", after the Environment table; a small script in
that HTML moves the block up to just under the heading (without JavaScript it stays where it is, whole)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_dflash.scrub.redact import redact

if TYPE_CHECKING:
    from pytest_dflash.report.verdict import VerdictBuilder

# The run's verdict as a colour: the worst host's. White text on these is at least 4.5:1 (WCAG AA).
VERDICT_ORDER = ("fail", "interrupted", "partial", "pass")
BANNER_COLOURS = {"pass": "#1b5e20", "fail": "#b71c1c", "partial": "#e65100", "interrupted": "#6a1b9a"}
MAX_CHANGES = 6  # per host on the first screen; the fleet summary lists them all

CSS = ("<style>#dflash-first-screen{margin:8px 0 16px;max-width:1200px}"
       "#dflash-first-screen .dflash-banner{font-size:22px;font-weight:bold;color:#fff;padding:8px 14px;"
       "margin:0 0 8px;border-radius:3px}"
       "#dflash-first-screen p,#dflash-first-screen li{color:#1a1a1a;margin:3px 0;overflow-wrap:break-word}"
       "#dflash-first-screen ul{margin:2px 0 6px;padding-left:22px}"
       "#dflash-first-screen h3{margin:10px 0 2px;font-size:15px;color:#1a1a1a}"
       "#dflash-first-screen .dflash-gate-failed{color:#b71c1c;font-weight:bold}"
       "#dflash-first-screen .dflash-gate-passed{color:#1b5e20;font-weight:bold}</style>")
# Moves the block above the Environment table and collapses that table (pytest-html's own toggle, the same
# classes its click handler sets, so one click opens it again).
SCRIPT = ("<script>(function(){var s=document.getElementById('dflash-first-screen'),"
          "h=document.getElementById('environment-header'),t=document.getElementById('environment');"
          "if(s&&h){h.parentNode.insertBefore(s,h);}"
          "if(h&&t){t.classList.add('hidden');h.classList.add('collapsed');}})();</script>")


def run_verdict(builder: VerdictBuilder) -> str:
    """The run's verdict: the worst of its hosts' ('pass' only when every host passes)."""
    verdicts = {v.final_verdict(builder.status) for v in builder.hosts.values()}
    return next((v for v in VERDICT_ORDER if v in verdicts), "pass")


def first_screen(builder: VerdictBuilder, gate: Mapping[str, Any] | None,
                 changed: Mapping[str, Mapping[str, Any] | None]) -> str:
    """The block (CSS, HTML and the script that moves it). `gate`: VerdictBuilder.gate's dict, None without
    --gate; `changed`: {failing host: fleet/trend.py's what_changed, or None with no good run on record}."""
    verdict = run_verdict(builder)
    colour = BANNER_COLOURS[verdict]
    finals = {name: v.final_verdict(builder.status) for name, v in sorted(builder.hosts.items())}
    passing = sum(1 for f in finals.values() if f == "pass")
    others = [f"{name} {final}" for name, final in finals.items() if final != "pass"]
    headline = (f"{verdict.upper()}: " + (", ".join(others[:5]) + (" …" if len(others) > 5 else "") + "; "
                                          if others else "")
                + f"{passing} of {len(finals)} host{'s' if len(finals) != 1 else ''} pass")
    parts = [CSS, f"<style>#title{{color:{colour}}}</style>",
             f'<section id="dflash-first-screen" data-verdict="{verdict}">',
             f'<p class="dflash-banner" style="background:{colour}">{_e(headline)}</p>',
             gate_block(gate), why_block(builder), changed_block(changed), "</section>", SCRIPT]
    return "".join(parts)


def gate_block(gate: Mapping[str, Any] | None) -> str:
    """The gate's result and, when it failed, why: its `why` lines (one per reason) where the gate gives
    them, else what refused it and each failing host's gated layers."""
    if gate is None:
        return ('<p class="dflash-gate">gate: none (this run had no --gate; its exit code follows the '
                "hosts' verdicts)</p>")
    layers = ",".join(gate.get("layers") or ())
    if gate.get("passed"):
        return (f'<p class="dflash-gate">gate {_e(layers)}: <span class="dflash-gate-passed">PASSED</span>'
                "</p>")
    why = gate_reasons(gate) or ["no host was tested"]
    items = "".join(f"<li>{_e(w)}</li>" for w in why)
    return (f'<p class="dflash-gate">gate {_e(layers)}: <span class="dflash-gate-failed">FAILED</span></p>'
            f'<ul class="dflash-gate-why">{items}</ul>')


def gate_reasons(gate: Mapping[str, Any]) -> list[str]:
    """Why a gate did not pass, a line each: its `why` where the gate gives one (VerdictBuilder.gate), else
    what refused it, then each host whose gated layers did not all pass, naming them and their outcome
    ('gpu-a: generation skipped'): a gate failed by a skipped layer says so."""
    if gate.get("passed"):
        return []
    if why := [str(w) for w in gate.get("why") or ()]:
        return why
    out = [str(r) for r in gate.get("refused") or ()]
    for host, outcomes in sorted((gate.get("hosts") or {}).items()):
        bad = [f"{layer} {outcome}" for layer, outcome in outcomes.items() if outcome != "passed"]
        if bad:
            out.append(f"{host}: {', '.join(bad)}")
    return out


def why_block(builder: VerdictBuilder) -> str:
    """Each host that did not pass, in a line or two: its first failure's diagnosis and remedy (or, with no
    diagnosis, the failure's first line), else why it is partial or interrupted."""
    items = []
    for name, verdict in sorted(builder.hosts.items()):
        final = verdict.final_verdict(builder.status)
        if final == "pass":
            continue
        lines: list[str] = []
        for failure in verdict.failures[:1]:
            diagnoses = [d for d in failure.get("diagnosis") or () if isinstance(d, Mapping)]
            if diagnoses:
                first = diagnoses[0]
                lines.append(f"[{first.get('id', '')}] {first.get('title', '')}")
                if first.get("remedy"):
                    lines.append(f"remedy: {first['remedy']}")
            else:
                lines.append(str(failure.get("message", "")).strip().splitlines()[0]
                             if str(failure.get("message", "")).strip() else "failed")
            lines.append(f"in {failure.get('test', '')}")
        if not lines:
            if final == "interrupted":
                lines.append(f"interrupted: {verdict.interrupted_reason(builder.status)}")
            else:
                lines += [f"{final}: {why}" for why in verdict.partial_reasons(builder.status)]
        if not lines and verdict.blocked:
            lines.append(f"blocked: {verdict.blocked[0].get('message', '')}")
        more = f" (+{len(verdict.failures) - 1} more failures below)" if len(verdict.failures) > 1 else ""
        items.append(f'<li data-host="{_e(name)}"><b>{_e(name)} {final.upper()}</b>{_e(more)}<br>'
                     + "<br>".join(_e(line) for line in lines if line) + "</li>")
    if not items:
        return ""
    return f'<h3>Why</h3><ul class="dflash-why">{"".join(items)}</ul>'


def changed_block(changed: Mapping[str, Mapping[str, Any] | None]) -> str:
    """What changed on each failing host since its last good run (fleet/trend.py's what_changed), and what
    could not be compared."""
    items = []
    for host, diff in sorted(changed.items()):
        if diff is None:
            items.append(f'<li data-host="{_e(host)}"><b>{_e(host)}</b>: no good run on record to compare '
                         "with</li>")
            continue
        since = diff.get("since") or {}
        head = f"<b>{_e(host)}</b> since {_e(str(since.get('run_id')))} ({_e(str(since.get('finished')))})"
        rows = [change_line(c) for c in (diff.get("changes") or ())[:MAX_CHANGES]]
        if not rows:
            rows = ["nothing it could compare changed"]
        if (count := int(diff.get("count") or 0)) > MAX_CHANGES:
            rows.append(f"… and {count - MAX_CHANGES} more (fleet-summary.html lists all)")
        rows += [f"not compared: {note}" for note in _notes(diff)]
        items.append(f'<li data-host="{_e(host)}">{head}<ul>'
                     + "".join(f"<li>{_e(r)}</li>" for r in rows) + "</ul></li>")
    if not items:
        return ""
    return f'<h3>What changed since the last good run</h3><ul class="dflash-changed">{"".join(items)}</ul>'


def change_line(change: Mapping[str, Any]) -> str:
    """'services.dflash.configured.command --speculative-num-draft-tokens: 8 → 6'."""
    before = "absent" if change.get("before") is None else str(change["before"])
    after = "absent" if change.get("after") is None else str(change["after"])
    return f"{change.get('key', '')}: {before} → {after}"


def _notes(diff: Mapping[str, Any]) -> list[str]:
    notes = diff.get("not_compared") or ()
    out = [str(n) for n in notes] if isinstance(notes, list) else []
    if diff.get("note"):
        out.append(str(diff["note"]))
    return out


def _e(text: str) -> str:
    return html.escape(redact(text))
