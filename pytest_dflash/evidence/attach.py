"""Evidence on test reports: log marks before each test, then, for a failure, the service log since the
mark, unit/process state, kernel-log lines and a diagnosis; and the `dflash` user property every
report carries to the controller (host, layer, services, blocked, diagnosis, facts).

Every report leaves here redacted and bounded (scrub/bounds.py): its failure text, each section, the property,
and all of them together (TEST_BYTES), whoever put them there (pytest's captured output included)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.errors import DflashError, GpuFault, ServiceCrashed, ServiceRestarted
from pytest_dflash.evidence.gather import gather
from pytest_dflash.run.blocking import Failure, is_blocked
from pytest_dflash.run.collection import ItemInfo
from pytest_dflash.run.stash import HANDLES_KEY, MARKS_KEY
from pytest_dflash.run.state import DflashRun, HostContext, ServiceHandle, readiness_error_summary
from pytest_dflash.scrub.bounds import (
    ITEM_BYTES,
    LINE_BYTES,
    LOG_BYTES,
    LOG_TAIL_LINES,
    LONGREPR_BYTES,
    PROPERTY_BYTES,
    TEST_BYTES,
    Keep,
    bound_obj,
    failure_text,
    human,
    nbytes,
    scrub,
)
from pytest_dflash.scrub.redact import is_secret, remember
from pytest_dflash.services.base import LogMark

JUNIT_PREFIX = "dflash."  # flat JUnit <property> names: dflash.host, dflash.layer, dflash.verdict, …
JUNIT_EVIDENCE = "dflash evidence for JUnit"
JUNIT_ATTR = "dflash_junit_evidence"  # the report attribute that carries it to the controller
# A test's outcome as the verdict counts it, worst first: what dflash.verdict says after its last phase.
_OUTCOME_RANK = ("failed", "blocked", "skipped", "passed")
_OUTCOME_KEY = pytest.StashKey[str]()


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
    """A service that died during the test fails it; a failure gets its evidence; every report the
    property."""
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
    if report.failed:
        if call.excinfo is not None and _reads_as_diagnosis(call.excinfo):
            report.longrepr = _concise(item, call.excinfo)
        elif call.excinfo is not None:
            _short_fixture_values(item, report, call.excinfo)
        # Redacted and capped first: the summary a later blocked skip quotes is taken from this text.
        _bound_longrepr(report, secrets)
        _attach_evidence(item, report, run, host, info, handles)
        if call.excinfo is not None and isinstance(call.excinfo.value, GpuFault):
            run.book.scope_to_gpus(item.nodeid, call.excinfo.value.gpus, call.excinfo.value.labels)
            info.gpus = list(call.excinfo.value.labels)
        if _junit(item):
            _junit_evidence(report, secrets)
    elif report.skipped:
        _bound_longrepr(report, secrets)
        if report.when in ("setup", "call"):
            info.blocked = is_blocked(skip_message(report))
            if info.blocked:
                _point_at_root(item, report, run, info, handles)
    news = _report_info(host, info, handles)
    junit_reads = report.when == "teardown" and _junit(item)  # JUnit takes a testcase's properties from there
    if report.passed and report.when != "call" and not _has_news(news) and not junit_reads:
        # A passing setup or teardown that learned nothing new says nothing the call report does not (the
        # verdict counts calls, skips and failures): it goes without the property, which was two thirds of a
        # fleet worker's reports bounded, redacted and serialized for nothing.
        property_: dict[str, Any] | None = None
    else:
        property_ = bounded_info(news, secrets)
    if report.sections:
        carried = (nbytes(report.longreprtext) if report.longrepr is not None else 0) + _json_size(property_)
        _bound_sections(report, secrets, TEST_BYTES - carried)
    if property_ is not None:
        report.user_properties.append(("dflash", property_))
        report.user_properties.extend(junit_properties(item, report, host, info, handles, secrets))


def junit_properties(item: pytest.Item, report: pytest.TestReport, host: HostContext, info: ItemInfo,
                     handles: list[ServiceHandle], secrets: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Flat string properties for JUnit's <property> (the `dflash` dict never reaches it: JUnitEvidence):
    host, layer, service(s), algorithm(s), diagnosis ids, and the test's outcome so far as the verdict counts
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
        "verdict": outcome,
    }
    return [(JUNIT_PREFIX + key, scrub(value, LINE_BYTES, "property", extra=secrets))
            for key, value in values.items() if value or key in ("host", "layer", "verdict")]


def _junit_evidence(report: pytest.TestReport, secrets: tuple[str, ...]) -> None:
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


def _secrets(handles: list[ServiceHandle]) -> tuple[str, ...]:
    return tuple(key for h in handles if (key := h.api_key_in_use))


_PACKAGE = Path(__file__).resolve().parents[1]


def _reads_as_diagnosis(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    """A service/transport/API failure, or a check of the plugin's that failed (an AssertionError raised
    inside pytest_dflash: its message is the evidence). Not a test's own `assert` (pytest's explanation of it
    is the point) and not a bug of the plugin (its traceback is)."""
    if isinstance(excinfo.value, DflashError):
        return True
    if not isinstance(excinfo.value, AssertionError) or not excinfo.traceback:
        return False
    return Path(str(excinfo.traceback[-1].path)).resolve().is_relative_to(_PACKAGE)


def _concise(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """The exception and its message first (the short summary, JUnit's message= and the verdict quote that
    line), then where in the test it was raised; no traceback through the plugin, no repr of its fixtures."""
    where = ""
    path = str(getattr(item, "path", ""))
    for entry in reversed(excinfo.traceback):
        if str(entry.path) == path:
            where = f"\n(raised at {item.location[0]}:{entry.lineno + 1}, in {item.name})"
            break
    return f"{type(excinfo.value).__name__}: {failure_text(excinfo.value)}{where}"


def _short_fixture_values(item: pytest.Item, report: pytest.TestReport,
                          excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """A test's own failing `assert` keeps pytest's traceback and explanation, but the arguments and locals it
    lists show the plugin's fixtures as what they are (`<ServiceHandle gpu7/dflash>`), not as dataclass dumps
    with thread events and addresses."""
    funcargs = getattr(item, "funcargs", {})
    values = {name: value for name, value in funcargs.items() if name.startswith("dflash_")}
    if not values:
        return
    kinds = tuple({type(v) for value in values.values()
                   for v in (value if isinstance(value, tuple) else (value,))})
    frames: dict[str, object] = {}  # the locals of the failing frames that hold one of those objects
    for entry in excinfo.traceback:
        with contextlib.suppress(Exception):
            frames.update((k, v) for k, v in entry.locals.items() if isinstance(v, kinds))
    short = {name: _short_value(value) for name, value in values.items()}
    for reprtraceback, _, _ in getattr(report.longrepr, "chain", None) or ():
        for entry in getattr(reprtraceback, "reprentries", ()):
            reprfuncargs = getattr(entry, "reprfuncargs", None)
            if reprfuncargs is not None:
                reprfuncargs.args = [(name, short.get(name, value)) for name, value in reprfuncargs.args]
            reprlocals = getattr(entry, "reprlocals", None)
            if reprlocals is not None:  # --showlocals: "name       = value" lines
                lines = []
                for line in reprlocals.lines:
                    name = line.split(" ", 1)[0]
                    value = short.get(name) or (_short_value(frames[name]) if name in frames else None)
                    lines.append(f"{name:<10} = {value}" if value else line)
                reprlocals.lines = lines


def _short_value(value: object) -> str:
    if isinstance(value, tuple):
        return f"({', '.join(_short_value(v) for v in value)})"
    label = getattr(value, "label", None) or getattr(value, "name", None)
    return f"<{type(value).__name__}{f' {label}' if isinstance(label, str) else ''}>"


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


def _bound_longrepr(report: pytest.TestReport, secrets: tuple[str, ...]) -> None:
    """A failure's text redacted and cut to LONGREPR_BYTES (head: the assertion; tail: where it failed);
    a skip's reason to ITEM_BYTES. The report keeps pytest's own object when nothing had to change."""
    longrepr = report.longrepr
    if longrepr is None:
        return
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, lineno, message = longrepr
        clean = scrub(str(message), ITEM_BYTES, "skip reason", extra=secrets)
        if clean != message:
            report.longrepr = (path, lineno, clean)
        return
    text = report.longreprtext
    clean = scrub(text, LONGREPR_BYTES, "failure text", extra=secrets)
    if clean != text:
        report.longrepr = clean


def _section_limit(title: str) -> tuple[int, int, str, Keep]:
    """(priority, limit, what, keep) of a report section: the diagnosis first, captured output last."""
    if title == "dflash diagnosis":
        return 0, ITEM_BYTES, "diagnosis", "both"
    if title.startswith(("log ", "journal ")):
        return 1, LOG_BYTES, "log tail", "tail"
    if title.startswith("kernel log"):
        return 2, ITEM_BYTES, "kernel log excerpt", "tail"
    if title.startswith("Captured "):
        return 3, ITEM_BYTES, "captured output", "both"
    return 2, ITEM_BYTES, "report section", "both"


def _bound_sections(report: pytest.TestReport, secrets: tuple[str, ...], budget: int) -> None:
    """Each section redacted and capped; together within `budget` (what the test may still carry), spent on
    the diagnosis and the logs before captured output."""
    sections = list(report.sections)
    if not sections:
        return
    order = sorted(range(len(sections)), key=lambda i: _section_limit(sections[i][0])[0])
    for index in order:
        title, body = sections[index]
        _, limit, what, keep = _section_limit(title)
        room = min(limit, budget)
        if room < 256:
            body = f"[… {nbytes(body):,} bytes cut: cap {human(TEST_BYTES)} per test reached]"
        else:
            body = scrub(body, room, what, keep=keep, extra=secrets)
        budget -= nbytes(body)
        sections[index] = (title, body)
    report.sections = sections


def _json_size(value: Any) -> int:
    return len(json.dumps(value, default=str, ensure_ascii=False).encode())


def bounded_info(info: dict[str, Any], secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    """The `dflash` property redacted and within PROPERTY_BYTES as JSON (it goes into JUnit's properties and
    the verdict): strings cut to ITEM_BYTES, then shorter; if still too big, the largest of notes / facts /
    metrics / diagnoses is dropped (emptied, types kept for the verdict builder) and a note says so."""
    item = ITEM_BYTES
    clean: dict[str, Any] = bound_obj(info, item=item, what="verdict entry", extra=secrets)
    while _json_size(clean) > PROPERTY_BYTES and item > 512:
        item //= 2
        clean = bound_obj(info, item=item, what="verdict entry", extra=secrets)
    droppable = ("facts", "service_facts", "metrics", "notes", "diagnosis")
    dropped: list[str] = []
    while _json_size(clean) > PROPERTY_BYTES:
        present = [key for key in droppable if clean.get(key) and key not in dropped]
        if not present:
            break
        key = max(present, key=lambda k: _json_size(clean[k]))
        cut = _json_size(clean[key])
        clean[key] = type(clean[key])()
        dropped.append(key)
        note = f"[… {cut:,} bytes of {key} cut: cap {human(PROPERTY_BYTES)} per test property]"
        clean["notes"] = [*clean.get("notes", []), note]
    return clean


def first_line(text: str, longrepr: object = None) -> str:
    """What a summary shows of a failure: pytest's crash line ('ExcType: message', the exception's own words)
    when the report has one, else the assertion's first line ('E ...': a traceback kept as text, e.g. once
    capped), else a plain-text failure's first line, else the last line. Never the log tail an exception's
    message carries after its first line."""
    crash = getattr(longrepr, "reprcrash", None)
    message = str(getattr(crash, "message", "") or "").strip()
    if message:
        return scrub(message.splitlines()[0], LINE_BYTES, "summary")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("E "):
            return scrub(line[2:].strip(), LINE_BYTES, "summary")
    if isinstance(longrepr, str) and longrepr.strip():
        # a plain-text failure (the exception and its message first, or a pytest.fail message):
        # its own first line, not the text's (under xdist, the worker's "[gw0] linux -- …" line)
        return scrub(longrepr.strip().splitlines()[0], LINE_BYTES, "summary")
    return scrub((text.strip().splitlines() or [""])[-1], LINE_BYTES, "summary")


def _report_info(host: HostContext, info: ItemInfo, handles: list[ServiceHandle]) -> dict[str, Any]:
    # a service that never became ready is recorded too: how far its start-up got (`stopped`)
    facts = {h.name: h.facts() for h in handles if h.ready is not None or h.stopped is not None}
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


def _junit(item: pytest.Item) -> bool:
    return bool(getattr(item.config.option, "xmlpath", None))
