"""Evidence on test reports: log marks before each test, then, for a failure, the service log since the
mark, unit/process state, kernel-log lines and a diagnosis per root cause, which leads the failure's text
(evidence/failure_text.py); and the `dflash` user property every report carries to the controller (host,
layer, services, blocked, diagnosis, the ranks that died or stopped, facts). JUnit's view: evidence/junit.py.

Every report leaves here redacted and bounded (evidence/bounding.py, scrub/bounds.py): its failure text, each
section, the property, and all of them together (TEST_BYTES), whoever put them there (pytest's captured output
included)."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_dflash.errors import DflashError, GpuFault, ServiceCrashed, ServiceRestarted
from pytest_dflash.evidence.bounding import bound_longrepr, bound_sections, bounded_info, json_size
from pytest_dflash.evidence.failure_text import (
    Symptom,
    drop_log_tail,
    first_line,
    lead_with,
    reads_as_diagnosis,
    short_fixture_values,
    symptom,
)
from pytest_dflash.evidence.gather import Evidence, gather
from pytest_dflash.evidence.junit import (
    JUnitEvidence,
    junit_evidence,
    junit_on,
    junit_properties,
    junit_user_properties,
)
from pytest_dflash.run.blocking import Failure, is_blocked
from pytest_dflash.run.collection import ItemInfo
from pytest_dflash.run.handle import ServiceHandle, readiness_error_summary
from pytest_dflash.run.stash import HANDLES_KEY, MARKS_KEY
from pytest_dflash.run.state import DflashRun, HostContext
from pytest_dflash.scrub.bounds import LINE_BYTES, TEST_BYTES, nbytes, scrub
from pytest_dflash.scrub.redact import is_secret, remember
from pytest_dflash.services.base import LogMark

# re-exported: the names plugin.py, report/ and the self-tests read here
__all__ = ["JUnitEvidence", "annotate", "bounded_info", "first_line", "junit_user_properties", "mark_logs",
           "remember_run_secrets", "run_secrets", "skip_message"]

# the ranks of a test's services that died or stopped, as the verdict's services.<svc>.ranks entries
_RANKS_KEY = pytest.StashKey[dict[str, list[dict[str, Any]]]]()


def run_secrets(run: DflashRun) -> Iterator[str]:
    """Literal secrets the profiles hand to services: API keys (from api_key_env), secret-named env values,
    the values of secret flags in commands (`--api-key K`, `--api-key=K`)."""
    for profile in run.profiles.values():
        for spec in profile.services.values():
            if spec.api_key_env:
                yield os.environ.get(spec.api_key_env, "")
            yield from (value for key, value in spec.env.items() if is_secret(key, value))
            args = list(spec.command)
            for i, arg in enumerate(args):
                flag, eq, value = arg.partition("=")
                value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
                if flag.startswith("--") and is_secret(flag, value):
                    yield value


def remember_run_secrets(run: DflashRun) -> None:
    """Hand the profiles' literal secrets to the redactor, once, when the run is built
    (plugin.pytest_configure): before the pre-flight's first line, and not again per test (that walked every
    host's services for every report of every host: the square of the fleet)."""
    remember(*(s for s in run_secrets(run) if len(s) >= 8))  # a short literal would mask ordinary words


def mark_logs(item: pytest.Item, run: DflashRun, info: ItemInfo) -> None:
    """Before the test: where each of its services' logs stands, so evidence is only what the test saw."""
    host = run.host(info.host)
    marks: dict[str, LogMark] = {}
    for name in info.services:
        handle = host.service(name)
        if handle.manager.provisioned or host.has_host_access:
            with contextlib.suppress(DflashError):
                marks[name] = handle.manager.log_mark()
    item.stash[MARKS_KEY] = marks


def annotate(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport, run: DflashRun,
             info: ItemInfo) -> None:
    """A service that died during the test fails it; a failure gets its evidence, its diagnosis first; every
    report the property."""
    host = run.host(info.host)
    handles = item.stash.get(HANDLES_KEY, [])
    secrets = _secrets(handles)
    death: ServiceCrashed | ServiceRestarted | None = None
    if report.when == "call":
        for handle in handles:
            death = handle.check_alive()
            if death is not None:
                run.book.record_death(Failure(info.host, "service", handle.name, item.nodeid,
                                              scrub(str(death), LINE_BYTES, "summary", extra=secrets)))
                if report.passed:
                    report.outcome = "failed"
                    report.longrepr = f"the test passed but {death}"
                break
    said: Symptom | None = None
    if report.failed:
        if call.excinfo is not None and reads_as_diagnosis(call.excinfo):
            said = symptom(item, call.excinfo)
            report.longrepr = said.text()
        elif call.excinfo is not None:
            short_fixture_values(item, report, call.excinfo)
        # Redacted and capped first: the summary a later blocked skip quotes is taken from this text.
        bound_longrepr(report, secrets)
        errors = tuple(e for e in (call.excinfo.value if call.excinfo else None, death) if e is not None)
        evidence = _attach_evidence(item, report, run, host, info, handles, errors)
        if evidence is not None:
            _lead_with_diagnosis(report, evidence, said)
            bound_longrepr(report, secrets)
        if call.excinfo is not None and isinstance(call.excinfo.value, GpuFault):
            run.book.scope_to_gpus(item.nodeid, call.excinfo.value.gpus, call.excinfo.value.labels)
            info.gpus = list(call.excinfo.value.labels)
        if junit_on(item):
            junit_evidence(report, secrets)
    elif report.skipped:
        bound_longrepr(report, secrets)
        if report.when in ("setup", "call"):
            info.blocked = is_blocked(skip_message(report))
            if info.blocked:
                _point_at_root(item, report, run, info, handles)
    ranks = item.stash.get(_RANKS_KEY, {})
    news = _report_info(host, info, handles, ranks)
    if report.failed:
        news["symptom"] = scrub(said.message if said else first_line(report.longreprtext, report.longrepr),
                                LINE_BYTES, "summary", extra=secrets)
    junit_reads = report.when == "teardown" and junit_on(item)  # JUnit takes a testcase's properties there
    if report.passed and report.when != "call" and not _has_news(news) and not junit_reads:
        # A passing setup or teardown that learned nothing new says nothing the call report does not (the
        # verdict counts calls, skips and failures): it goes without the property, which was two thirds of a
        # fleet worker's reports bounded, redacted and serialized for nothing.
        property_: dict[str, Any] | None = None
    else:
        property_ = bounded_info(news, secrets)
    if report.sections:
        carried = (nbytes(report.longreprtext) if report.longrepr is not None else 0) + json_size(property_)
        bound_sections(report, secrets, TEST_BYTES - carried)
    if property_ is not None:
        report.user_properties.append(("dflash", property_))
        report.user_properties.extend(junit_properties(item, report, host, info, handles, secrets, ranks))


def _lead_with_diagnosis(report: pytest.TestReport, evidence: Evidence, said: Symptom | None) -> None:
    """The failure's text: its diagnosis and remedy first, then the symptom and where, the log once (in its
    section, not again as the tail the error carried). A traceback of a test's own `assert` stays pytest's,
    under the diagnosis."""
    diagnosis = evidence.diagnoses[0] if evidence.diagnoses else None
    if said is not None and diagnosis is not None and said.message.startswith(f"[{diagnosis.id}] "):
        diagnosis = None  # the check's own message leads with it already (and its remedy on the next line)
    shown = bool(evidence.logs)  # the log is in a section of its own
    if said is not None:
        report.longrepr = lead_with(diagnosis, said.text(tail=not shown))
    elif diagnosis is not None or (shown and isinstance(report.longrepr, str)):
        text = report.longreprtext if diagnosis is not None else str(report.longrepr)
        report.longrepr = lead_with(diagnosis, drop_log_tail(text) if shown else text)


def _secrets(handles: list[ServiceHandle]) -> tuple[str, ...]:
    return tuple(key for h in handles if (key := h.api_key_in_use))


_ITEMS_KEY = pytest.StashKey[dict[str, pytest.Item]]()


def _point_at_root(item: pytest.Item, report: pytest.TestReport, run: DflashRun, info: ItemInfo,
                   handles: list[ServiceHandle]) -> None:
    """A blocked skip's location: the test that failed (its file and line), not the plugin line that raised
    the skip; the skips one failure blocks then fold into one line of the short summary."""
    longrepr = report.longrepr
    if not (isinstance(longrepr, tuple) and len(longrepr) == 3):
        return
    failure = run.book.blocker(info.host, info.layer, info.services)
    root = failure.test if failure is not None else next(
        (h.failure_reported_by for h in handles if h.failure_reported_by), None)
    session = item.session
    items = session.stash.get(_ITEMS_KEY, None)
    if items is None or root not in items:
        items = session.stash[_ITEMS_KEY] = {i.nodeid: i for i in session.items}
    failed = items.get(root or "")
    if failed is None:
        return
    path, lineno, _ = failed.reportinfo()
    report.longrepr = (str(path), (lineno or 0) + 1, longrepr[2])


def skip_message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def _attach_evidence(item: pytest.Item, report: pytest.TestReport, run: DflashRun, host: HostContext,
                     info: ItemInfo, handles: list[ServiceHandle],
                     errors: tuple[BaseException, ...]) -> Evidence | None:
    started = time.monotonic()
    text = report.longreprtext
    marks = item.stash.get(MARKS_KEY, {})
    try:
        evidence = gather(host, handles, marks, text, lines=run.options.journal_lines, errors=errors)
    except DflashError as exc:  # evidence is best effort; the failure itself stands
        report.sections.append(("dflash evidence", f"could not collect evidence: {exc}"))
        return None
    for title, body in evidence.sections:
        report.sections.append((title, body))
    info.diagnosis = [d.as_dict() for d in evidence.diagnoses]
    if evidence.ranks:
        item.stash[_RANKS_KEY] = {service: [fault.as_dict() for fault in faults]
                                  for service, faults in evidence.ranks.items()}
    secrets = _secrets(handles)
    summary = evidence.diagnoses[0].one_line() if evidence.diagnoses else first_line(text, report.longrepr)
    service = info.services[0] if len(info.services) == 1 else None
    run.book.record(Failure(info.host, info.layer, service, item.nodeid,
                            scrub(summary, LINE_BYTES, "summary", extra=secrets)))
    for handle in handles:
        if handle.failure is not None:
            run.book.record_death(Failure(info.host, "service", handle.name, item.nodeid,
                                          scrub(readiness_error_summary(handle.failure), LINE_BYTES,
                                                "summary", extra=secrets)))
    read = [title for title, _ in evidence.sections if title != "dflash diagnosis"]
    report.sections.append(("dflash evidence",
                            f"collected in {time.monotonic() - started:.2f}s: {'; '.join(read) or 'nothing'}"
                            + (f"\nmissing: {evidence.missing}" if evidence.missing and not evidence.diagnoses
                               else "")))
    return evidence


def _report_info(host: HostContext, info: ItemInfo, handles: list[ServiceHandle],
                 ranks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    # a service that never became ready is recorded too: how far its start-up got (`stopped`)
    facts = {h.name: h.facts() for h in handles if h.ready is not None or h.stopped is not None}
    for service, faults in ranks.items():  # the verdict's services.<svc>.ranks: those that died or stopped
        facts.setdefault(service, {})["ranks"] = faults
    for handle in handles:
        accept = handle.host.facts.accept_lengths.get(handle.name)
        if accept is not None:
            facts.setdefault(handle.name, {})["accept_length"] = accept
    notes, host.notes[:] = list(host.notes), []
    return {
        "host": info.host,
        "profile": str(host.profile.source),
        "connection": host.profile.display_connection,
        "layer": info.layer,
        "services": list(info.services),
        "blocked": info.blocked,
        "diagnosis": info.diagnosis,
        **({"gpus": info.gpus} if info.gpus else {}),
        "service_facts": _changed(host, "service_facts", facts),
        "notes": notes,
        "metrics": _changed(host, "metrics", host.facts.metrics),
        # host.facts.export: facts a layer wants in the verdict (env snapshot, driver, JIT cache, …)
        "facts": _changed(host, "facts", host.facts.export),
    }


def _changed(host: HostContext, section: str, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of `values` that differ from what this process last reported for the host. The controller's
    VerdictBuilder merges each report's entries into the host's verdict (newest wins), so the verdict is the
    same, and a report carries what changed, not the host's whole state again: bounding, redacting and sending
    that on every phase report was a fifth of a fleet worker's CPU. Compared with a deep copy of what was sent
    (a C-level ==, not a JSON dump of every entry on every report), so an entry a layer changed in place is
    sent again; an entry that cannot be copied or compared is sent every time."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        sent = host.reported.get((section, key), _UNSENT)
        try:
            same = sent is not _UNSENT and bool(sent == value)
        except Exception:  # e.g. an array's ambiguous truth value: not provably the same
            same = False
        if same:
            continue
        try:
            host.reported[(section, key)] = copy.deepcopy(value)
        except Exception:  # an object deepcopy refuses: never remembered, so always sent
            host.reported.pop((section, key), None)
        out[key] = value
    return out


_UNSENT = object()
# what a report's property carries only when it changed
_NEWS = ("service_facts", "notes", "metrics", "facts")


def _has_news(property_: dict[str, Any]) -> bool:
    return any(property_[key] for key in _NEWS)
