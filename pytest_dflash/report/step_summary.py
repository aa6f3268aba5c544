"""GitHub Actions job summary: when $GITHUB_STEP_SUMMARY is set, the controller appends a Markdown verdict
table at session end (one row per host: verdict, each layer's outcome, the first failure and its diagnosis
id).

Redacted like the verdict, with no control character (a server's error text is in it), and bounded
(SUMMARY_BYTES; GitHub takes 1 MiB per step): failing hosts come first, so a cut fleet table still shows them,
and a cut says how many hosts it left out."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.layers import LAYERS
from pytest_dflash.report.first_screen import gate_reasons
from pytest_dflash.report.verdict import HostVerdict, VerdictBuilder
from pytest_dflash.scrub.bounds import KB, nbytes
from pytest_dflash.scrub.redact import redact
from pytest_dflash.scrub.terminal import terminal_safe

ENV = "GITHUB_STEP_SUMMARY"
SUMMARY_BYTES = 128 * KB  # of one run's table
CELL_CHARS = 200  # of one failure text in a cell
MARKS = {"pass": "✅ pass", "fail": "❌ fail", "partial": "⚠️ partial", "interrupted": "⛔ interrupted",
         "passed": "✅", "failed": "❌", "blocked": "⛔ blocked", "skipped": "skipped", "not-run": "–"}
_ORDER = {"fail": 0, "interrupted": 1, "partial": 2, "pass": 3}


def append(config: pytest.Config, builder: VerdictBuilder, gate: Mapping[str, Any] | None) -> None:
    """Append the verdict table to $GITHUB_STEP_SUMMARY (nothing when it is unset); a file that cannot be
    written is one line on the terminal, never an error of the run."""
    target = os.environ.get(ENV, "")
    if not target or not builder.hosts:
        return
    try:
        with Path(target).open("a", encoding="utf-8") as out:
            out.write(markdown(builder, gate))
    except OSError as exc:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"dflash: ${ENV} {target}: cannot append the verdict table: "
                                f"{exc.strerror or exc}")


def markdown(builder: VerdictBuilder, gate: Mapping[str, Any] | None = None) -> str:
    """The table as Markdown, at most SUMMARY_BYTES."""
    status = builder.status
    head = [f"### pytest-dflash verdict (run `{_code(builder.run_id)}`)", ""]
    if gate is not None:
        passed = "✅ passed" if gate.get("passed") else "❌ failed"
        head.append(f"Gate `{_code(','.join(gate.get('layers', [])))}`: **{passed}**")
        head += [f"- {_cell(reason)}" for reason in gate_reasons(gate)]  # the layer and why, per host
        head += [f"- outside the gate: {_cell(str(what))}" for what in gate.get("outside", [])]
        head.append("")
    if status.interrupted:
        head += [f"**Interrupted:** {_cell(status.interrupted)}", ""]
    head += [f"**Partial:** {_cell(reason)}" for reason in status.partial]
    if status.partial:
        head.append("")
    layers = [f"{layer} layer" if layer == "host" else layer for layer in LAYERS]  # not two "host" columns
    head += ["| host | verdict | " + " | ".join(layers) + " | first failure | diagnosis |",
             "|---|---|" + "---|" * len(LAYERS) + "---|---|"]
    hosts = sorted(builder.hosts.items(), key=lambda kv: (_ORDER.get(kv[1].final_verdict(status), 9), kv[0]))
    text = "\n".join(head) + "\n"
    for index, (name, verdict) in enumerate(hosts):
        row = _row(name, verdict, verdict.final_verdict(status)) + "\n"
        if nbytes(text) + nbytes(row) > SUMMARY_BYTES - 256:
            left = len(hosts) - index
            text += (f"\n… {left} more host(s) left out: cap {SUMMARY_BYTES // KB} KB "
                     f"(see the verdict files)\n")
            break
        text += row
    return text + "\n"


def _row(name: str, verdict: HostVerdict, final: str) -> str:
    outcomes = verdict.layer_outcomes()
    failure, diagnosis = "", ""
    first = verdict.failures[0] if verdict.failures else verdict.blocked[0] if verdict.blocked else None
    if first is not None:
        failure = f"`{_code(str(first.get('test', '')))}`: {_cell(str(first.get('message', '')))}"
        diagnosis = ", ".join(f"`{_code(str(d.get('id', '')))}`" for d in (first.get("diagnosis") or [])[:3]
                              if isinstance(d, dict))
    cells = [_cell(name), MARKS.get(final, final), *(MARKS.get(o, o) for o in outcomes.values()), failure,
             diagnosis]
    return "| " + " | ".join(cells) + " |"


def _flat(text: str) -> str:
    """Redacted, one line, no control character (scrub/terminal.py), at most CELL_CHARS."""
    line = " ".join(terminal_safe(redact(text)).split())
    return line if len(line) <= CELL_CHARS else line[: CELL_CHARS - 1] + "…"


def _cell(text: str) -> str:
    """One table cell of text: Markdown's own characters and pipes escaped."""
    return _flat(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")


def _code(text: str) -> str:
    """Text for inside `backticks` (a code span takes no escapes but a table's pipe): no backticks of its
    own."""
    return _flat(text).replace("`", "'").replace("|", "\\|")
