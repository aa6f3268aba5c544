"""Evidence on test reports: log marks before each test, then, for a failure, the service log since the
mark, unit/process state, kernel-log lines and a diagnosis; and the `dflash` user property every
report carries to the controller (host, layer, services, blocked, diagnosis, facts)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from pytest_dflash.errors import DflashError, ServiceCrashed, ServiceRestarted
from pytest_dflash.evidence.gather import gather
from pytest_dflash.evidence.redact import redact
from pytest_dflash.run.collection import ItemInfo
from pytest_dflash.run.layers import Failure, is_blocked
from pytest_dflash.run.stash import HANDLES_KEY, MARKS_KEY
from pytest_dflash.run.state import DflashRun, HostContext, ServiceHandle, readiness_error_summary
from pytest_dflash.services.base import LogMark

LOG_TAIL_LINES = 40  # of the service log in a failure message (the full window is its own report section)


def failure_text(exc: BaseException) -> str:
    """The message of a service failure plus the end of its log, redacted."""
    text = str(exc)
    tail = getattr(exc, "log_tail", "")
    if tail:
        lines = tail.strip().splitlines()[-LOG_TAIL_LINES:]
        text += "\n--- last lines of the service log ---\n" + "\n".join(lines)
    return redact(text)


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
    """A service that died during the test fails it; a failure gets its evidence; every report the property."""
    host = run.host(info.host)
    handles = item.stash.get(HANDLES_KEY, [])
    death: ServiceCrashed | ServiceRestarted | None = None
    if report.when == "call":
        for handle in handles:
            death = handle.check_alive()
            if death is not None:
                run.book.record_death(Failure(info.host, "service", handle.name, item.nodeid, str(death)))
                if report.passed:
                    report.outcome = "failed"
                    report.longrepr = f"the test passed but {death}"
                break
    if report.failed:
        if call.excinfo is not None and isinstance(call.excinfo.value, DflashError):
            report.longrepr = _concise(item, call.excinfo)
        _attach_evidence(item, report, run, host, info, handles)
    elif report.skipped and report.when in ("setup", "call"):
        info.blocked = is_blocked(skip_message(report))
    report.user_properties.append(("dflash", _report_info(host, info, handles)))


def _concise(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """A service/transport/API failure needs its message and the service log, not plugin internals."""
    where = ""
    path = str(getattr(item, "path", ""))
    for entry in reversed(excinfo.traceback):
        if str(entry.path) == path:
            where = f"{entry.path}:{entry.lineno + 1}: "
            break
    return f"{where}{type(excinfo.value).__name__}: {failure_text(excinfo.value)}"


def skip_message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def _attach_evidence(item: pytest.Item, report: pytest.TestReport, run: DflashRun, host: HostContext,
                     info: ItemInfo, handles: list[ServiceHandle]) -> None:
    started = time.monotonic()
    text = report.longreprtext
    marks = item.stash.get(MARKS_KEY, {})
    try:
        evidence = gather(host, handles, marks, text, lines=run.options.journal_lines)
    except DflashError as exc:  # evidence is best effort; the failure itself stands
        report.sections.append(("dflash evidence", f"could not collect evidence: {exc}"))
        return
    for title, body in evidence.sections:
        report.sections.append((title, body))
    info.diagnosis = [d.as_dict() for d in evidence.diagnoses]
    summary = evidence.diagnoses[0].one_line() if evidence.diagnoses else first_line(text)
    service = info.services[0] if len(info.services) == 1 else None
    run.book.record(Failure(info.host, info.layer, service, item.nodeid, summary))
    for handle in handles:
        if handle.failure is not None:
            run.book.record_death(Failure(info.host, "service", handle.name, item.nodeid,
                                          readiness_error_summary(handle.failure)))
    report.sections.append(("dflash evidence", f"collected in {time.monotonic() - started:.2f}s"))
    report.longrepr = _redacted_longrepr(report)


def _redacted_longrepr(report: pytest.TestReport) -> Any:
    text = report.longreprtext
    clean = redact(text)
    return report.longrepr if clean == text else clean


def first_line(text: str) -> str:
    """The assertion's first line ('E ...'), else the last line: what a summary shows of a failure."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("E "):
            return line[2:].strip()[:300]
    return (text.strip().splitlines() or [""])[-1][:300]


def _report_info(host: HostContext, info: ItemInfo, handles: list[ServiceHandle]) -> dict[str, Any]:
    facts = {h.name: h.facts() for h in handles if h.ready is not None}
    for handle in handles:
        accept = handle.host.facts.get(f"accept_length:{handle.name}")
        if accept is not None:
            facts.setdefault(handle.name, {})["accept_length"] = accept
    notes, host.notes[:] = list(host.notes), []
    return {
        "host": info.host,
        "profile": str(host.profile.source),
        "connection": host.profile.connection,
        "layer": info.layer,
        "services": list(info.services),
        "blocked": info.blocked,
        "diagnosis": info.diagnosis,
        "service_facts": facts,
        "notes": notes,
        "metrics": dict(host.facts.get("metrics", {})),
        # host.facts["export"]: facts a layer wants in the verdict (env snapshot, driver, JIT cache, …)
        "facts": dict(host.facts.get("export", {})),
    }
