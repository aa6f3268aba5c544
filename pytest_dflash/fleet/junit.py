"""fleet-junit.xml: one testcase per host x layer, for CI systems that render JUnit.

    classname = "dflash.<host>", name = "<layer>"
    failed  -> <failure type="<diagnosis ids, root cause first | failed>"
                message="<[id] title — remedy: …, as the failure's own first line; else its message>">details
                (each failure: its diagnosis and remedy, the symptom, the ranks that died or stopped)
    blocked -> <skipped type="blocked" message="<root failure>">   (the root failure is its own testcase)
    skipped -> <skipped message="all tests of the layer skipped">
    not-run -> <skipped type="not-run" message="no test of the layer was selected">
    passed  -> an empty testcase
and, for a host whose verdict is 'interrupted' (a run killed before its end leaves its start's summary, which
says so), one more testcase name = "run" with <error type="interrupted" message="<why>">: a CI that reads
JUnit never takes an unfinished run for a clean one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree as ET

from pytest_dflash.report.ranks import rank_lines
from pytest_dflash.scrub.terminal import terminal_safe

# Characters XML 1.0 cannot carry at all (ANSI escapes in a log line would make the whole file invalid).
INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def clean(text: str) -> str:
    """Control characters written out (scrub/terminal.py), then what XML still cannot carry replaced."""
    return INVALID_XML.sub("\ufffd", terminal_safe(text))


def render_junit(summary: Mapping[str, Any]) -> str:
    hosts: Mapping[str, Mapping[str, Any]] = summary["hosts"]
    root = ET.Element("testsuites", {"name": "pytest-dflash fleet"})
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    suite = ET.SubElement(root, "testsuite", {"name": "dflash-fleet", "timestamp": str(summary["generated"])})
    for name, entry in hosts.items():
        if entry.get("verdict") == "interrupted":
            counts["tests"] += 1
            counts["errors"] += 1
            case = ET.SubElement(suite, "testcase", {"classname": clean(f"dflash.{name}"), "name": "run",
                                                     "time": "0"})
            ET.SubElement(case, "error", {"type": "interrupted", "message": clean(
                f"the run did not finish: {entry.get('interrupted') or 'interrupted'}")})
        for layer, outcome in entry["layers"].items():
            case = ET.SubElement(suite, "testcase", {"classname": clean(f"dflash.{name}"), "name": layer,
                                                     "time": "0"})
            counts["tests"] += 1
            if outcome == "failed":
                counts["failures"] += 1
                failures = [f for f in entry["failures"] if f["layer"] == layer]
                # root cause first, as each failure lists them (never alphabetical)
                ids = list(dict.fromkeys(d["id"] for f in failures for d in f["diagnosis"]))
                first = next((d for f in failures for d in f["diagnosis"]), None)
                message = (headline(first) if first is not None
                           else failures[0]["message"] if failures else "failed")
                element = ET.SubElement(case, "failure",
                                        {"type": ",".join(ids) or "failed", "message": clean(message)})
                ranks = rank_lines(entry.get("services") or {})
                element.text = clean("\n\n".join([*(_failure_text(f) for f in failures),
                                                    *(f"rank {line}" for line in ranks)]) or "failed")
            elif outcome == "blocked":
                counts["skipped"] += 1
                roots = [b["message"] for b in entry["blocked"] if layer in b.get("layers", [])]
                ET.SubElement(case, "skipped",
                              {"type": "blocked", "message": clean(roots[0]) if roots else "blocked"})
            elif outcome == "skipped":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", {"message": "every test of the layer was skipped"})
            elif outcome == "not-run":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped",
                              {"type": "not-run", "message": "no test of the layer was selected"})
    for element in (suite, root):
        for key, value in counts.items():
            element.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def headline(diagnosis: Mapping[str, Any]) -> str:
    """'[id] subject: title — remedy: …': a failure's first line, as the test's own report has it."""
    subject = f"{diagnosis['subject']}: " if diagnosis.get("subject") else ""
    remedy = f" — remedy: {diagnosis['remedy']}" if diagnosis.get("remedy") else ""
    return f"[{diagnosis['id']}] {subject}{diagnosis['title']}{remedy}"


def _failure_text(failure: Mapping[str, Any]) -> str:
    """The diagnoses (each once, root cause first), then the test and what it saw."""
    lines = [headline(diagnosis) for diagnosis in failure["diagnosis"]]
    lines.append(f"{failure['test']} ({failure['phase']}): {failure.get('symptom') or failure['message']}")
    return "\n".join(lines)
