"""What JUnit gets of a test report: flat `dflash.*` <property> elements (host, layer, services, algorithms,
diagnosis ids, the ranks that died or stopped, the verdict's outcome), the evidence inside <failure> (its
text, whose first line is the diagnosis and remedy: message=), and clean values for every other property."""

from __future__ import annotations

import json
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from pytest_dflash.run.collection import ItemInfo
from pytest_dflash.run.handle import ServiceHandle
from pytest_dflash.run.state import HostContext
from pytest_dflash.scrub.bounds import LINE_BYTES, LOG_BYTES, LOG_TAIL_LINES, LONGREPR_BYTES, nbytes, scrub

__all__ = ["JUNIT_ATTR", "JUNIT_EVIDENCE", "JUNIT_PREFIX", "JUnitEvidence", "junit_evidence", "junit_on",
           "junit_properties", "junit_user_properties"]

JUNIT_PREFIX = "dflash."  # flat JUnit <property> names: dflash.host, dflash.layer, dflash.verdict, …
JUNIT_EVIDENCE = "dflash evidence for JUnit"
JUNIT_ATTR = "dflash_junit_evidence"  # the report attribute that carries it to the controller
# A test's outcome as the verdict counts it, worst first: what dflash.verdict says after its last phase.
_OUTCOME_RANK = ("failed", "blocked", "skipped", "passed")
_OUTCOME_KEY = pytest.StashKey[str]()

def junit_properties(item: pytest.Item, report: pytest.TestReport, host: HostContext, info: ItemInfo,
                     handles: list[ServiceHandle], secrets: tuple[str, ...] = (),
                     ranks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> list[tuple[str, str]]:
    """Flat string properties for JUnit's <property> (the `dflash` dict never reaches it: JUnitEvidence):
    host, layer, service(s), algorithm(s), diagnosis ids (root cause first), the tensor-parallel ranks that
    died or stopped ('dflash: tensor-parallel rank TP1 (rank 1, pid 4242, GPU 5) died …'), and the test's
    outcome so far as the verdict counts
    it (failed > blocked > skipped > passed) — JUnit keeps the last phase's properties, so its testcase says
    what the whole test did (a failure xfailed by a marker is the failure it is, as in the verdict)."""
    if report.failed or (report.skipped and hasattr(report, "wasxfail")):
        outcome = "failed"
    elif report.skipped:
        outcome = "blocked" if info.blocked else "skipped"
    else:
        outcome = "passed"
    previous = item.stash.get(_OUTCOME_KEY, "passed")
    outcome = min(outcome, previous, key=_OUTCOME_RANK.index)
    item.stash[_OUTCOME_KEY] = outcome
    algorithms = []
    for name in info.services:
        handle = next((h for h in handles if h.name == name), None) or host.services.get(name)
        spec = host.profile.services.get(name)
        algorithms.append(handle.algorithm if handle is not None else spec.algorithm
                          if spec is not None else "?")
    values = {
        "host": info.host,
        "layer": info.layer,
        "service": ",".join(info.services),
        "algorithm": ",".join(algorithms),
        "diagnosis": ",".join(str(d.get("id", "")) for d in info.diagnosis),
        "ranks": "; ".join(f"{service}: {fault.get('said', '')}" for service, faults in (ranks or {}).items()
                           for fault in faults),
        "verdict": outcome,
    }
    return [(JUNIT_PREFIX + key, scrub(value, LINE_BYTES, "property", extra=secrets))
            for key, value in values.items() if value or key in ("host", "layer", "verdict")]


def junit_evidence(report: pytest.TestReport, secrets: tuple[str, ...]) -> None:
    """With --junitxml: the evidence report sections (diagnosis, service state, the end of each log), as one
    text for JUnit's <failure> (JUnitEvidence adds it there); JUnit writes report sections only with
    junit_logging, and then only captured output. Bounded so the failure text stays within LONGREPR_BYTES."""
    parts = []
    tail_in_text = "--- last lines of the service log ---" in report.longreprtext
    for title, body in report.sections:
        if title == "dflash diagnosis" or title.startswith(("service ", "kernel log ")):
            parts.append(f"--- {title} ---\n{body.strip()}")
        elif title.startswith(("log ", "journal ")) and not tail_in_text:
            lines = "\n".join(body.strip().splitlines()[-LOG_TAIL_LINES:])
            parts.append(f"--- {title} (last {LOG_TAIL_LINES} lines) ---\n{lines}")
    room = min(LONGREPR_BYTES - nbytes(report.longreprtext) - 256, LOG_BYTES // 2)
    if not parts or room < 512:
        return
    text = scrub("\n".join(parts), room, "JUnit evidence", keep="both", extra=secrets)
    # Kept beside the failure, not in it: the terminal prints the sections already, and JUnitEvidence puts
    # this into the <failure> text only while junitxml reads the report. A plain str attribute survives xdist.
    setattr(report, JUNIT_ATTR, text)


class _FailureText:
    """A longrepr for junitxml alone: its crash line as the failure message, the evidence after the
    traceback."""

    def __init__(self, original: Any, evidence: str, text: str) -> None:
        # junitxml's message attribute: the crash line, or the first line of a plain-text failure
        # (str(original), not the text: under xdist the text starts with the worker's "[gw0] linux -- …" line)
        self.reprcrash = getattr(original, "reprcrash", None) or types.SimpleNamespace(
            message=(str(original).strip().splitlines() or [""])[0])
        self._text = f"{text}\n--- {JUNIT_EVIDENCE} ---\n{evidence}"

    def __str__(self) -> str:
        return self._text


class JUnitEvidence:
    """With --junitxml: while the report hooks run, a failure's text carries its evidence (junitxml writes the
    <failure> element then); afterwards the report is as it was, so the terminal prints the evidence once.
    JUnit's <property> elements get clean values (junit_user_properties) while the report's own
    user_properties, which the controller builds the verdicts from, stay as they are."""

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # junitxml writes every user property as str(value) in LogXML.finalize and offers no hook to change
        # that: the `dflash` dict came out as a Python repr beside the flat dflash.* properties. So that one
        # method sees the JUnit view of the properties, and the report keeps its own list.
        from _pytest.junitxml import xml_key

        xml = session.config.stash.get(xml_key, None)
        finalize = getattr(xml, "finalize", None)
        if xml is None or not callable(finalize):
            return

        def finalize_with_clean_properties(report: pytest.TestReport) -> None:
            original = report.user_properties
            report.user_properties = junit_user_properties(original)
            try:
                finalize(report)
            finally:
                report.user_properties = original

        xml.finalize = finalize_with_clean_properties  # type: ignore[method-assign]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Iterator[None]:
        evidence = getattr(report, JUNIT_ATTR, None)
        if not evidence or not report.failed:
            return (yield)
        original = report.longrepr
        report.longrepr = _FailureText(original, evidence, report.longreprtext)  # type: ignore[assignment]
        try:
            return (yield)
        finally:
            report.longrepr = original


def junit_user_properties(properties: Iterable[tuple[str, object]]) -> list[tuple[str, object]]:
    """What JUnit's <property> elements get: the flat properties as they are; the `dflash` dict (the
    controller's input, whose CI-relevant part the flat dflash.* properties carry) left out; any other
    structured value (the perf layer's `dflash_perf` list, a user's record_property dict) as JSON, never a
    Python repr."""
    out: list[tuple[str, object]] = []
    for name, value in properties:
        if name == "dflash":
            continue
        if value is None or isinstance(value, str | int | float | bool):
            out.append((name, value))
        else:
            out.append((name, json.dumps(value, default=str, separators=(",", ":"))))
    return out


def junit_on(item: pytest.Item) -> bool:
    return bool(getattr(item.config.option, "xmlpath", None))
