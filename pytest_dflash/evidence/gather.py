"""Evidence for a failed test: log / journal tails since the test started, unit properties, kernel-log
lines about OOM and Xid, a diagnosis per root cause from the catalog (naming the tensor-parallel ranks that
died or stopped, with a remedy that fits how the service is run). Every log is read as bytes, at most its last
LOG_READ_BYTES (cut where it is read, whatever the source prints), and decoded with replacement; everything is
redacted, made safe to print and capped (scrub/bounds.py `scrub`) before it leaves: a log tail keeps its last
LOG_BYTES, every other section ITEM_BYTES."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_dflash.errors import DflashError, RankFault
from pytest_dflash.evidence.diagnosis import Diagnosis, diagnose, diagnosis_text, with_subject
from pytest_dflash.evidence.diagnosis.subjects import rank_faults, rank_subject, service_mode
from pytest_dflash.hostaccess.transport import journal_since
from pytest_dflash.scrub.bounds import ITEM_BYTES, LOG_BYTES, Keep, scrub
from pytest_dflash.services.base import LogMark, ServiceState

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle
    from pytest_dflash.run.state import HostContext

# What the diagnosis reads of each text (the end of a log): far more than a report shows, far less than a
# log of 30 KB lines can hold.
DIAGNOSIS_INPUT_BYTES = 256 * 1024
KERNEL_PATTERN = (r"Out of memory|oom-kill|oom_reaper|Killed process|NVRM: Xid|fallen off the bus|"
                  r"GPU has fallen")


@dataclass
class Evidence:
    sections: list[tuple[str, str]] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)
    missing: str = ""  # the log no one could read, and how to make it readable
    ranks: dict[str, list[RankFault]] = field(default_factory=dict)  # service -> ranks that died or stopped
    logs: list[str] = field(default_factory=list)  # the titles of the log sections (the log is shown there)

    def diagnosis_text(self) -> str:
        return diagnosis_text(self.diagnoses)


def missing_log_line(services: list[str]) -> str:
    """What evidence a diagnosis made without any service log lacks, and how to add it."""
    if not services:
        return ""
    return (f"no service log was read for {', '.join(services)} (attached by URL, nothing to read it with): "
            "only what was seen over HTTP is evidence here; to add the server's log, rerun with "
            "--attach-log-command CMD (e.g. 'journalctl -u sglang --since {since}') or give the service "
            "log_command or log_file in its profile (docs/profiles.md)")


def _since(mark: LogMark | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(mark.wall_time)) if mark else "start"


def kernel_log(host: HostContext, mark: LogMark | None) -> str:
    """OOM / Xid lines from the host's kernel log since `mark` (best effort, read-only)."""
    if not host.has_host_access:
        return ""
    since = journal_since(mark.wall_time, host.transport.clock_error_s) if mark else "-b"
    pattern = shlex.quote(KERNEL_PATTERN)
    command = (f"(journalctl -k {since} --no-pager 2>/dev/null || dmesg -T 2>/dev/null) "
               f"| grep -E {pattern} | tail -n 50")
    try:
        return host.transport.read_tail(command, timeout_s=15).stdout.strip()
    except DflashError:
        return ""


def gather(
    host: HostContext,
    handles: list[ServiceHandle],
    marks: dict[str, LogMark],
    failure_text: str,
    *,
    lines: int,
    errors: tuple[BaseException, ...] = (),
) -> Evidence:
    """Collect evidence for a failed test that used `handles` on `host`; `errors`: the exceptions of the
    failure (the test's own, the services' failures), read for the ranks they name."""
    evidence = Evidence()
    secrets = tuple(key for h in handles if (key := h.api_key_in_use))

    def clean(text: str, limit: int, what: str, keep: Keep = "both") -> str:
        return scrub(text, limit, what, keep=keep, extra=secrets)

    # Diagnose redacted text: a diagnosis quotes the log line that matched, and goes into the verdict JSON.
    texts = [clean(failure_text, DIAGNOSIS_INPUT_BYTES, "diagnosed text")]
    logless: list[str] = []  # services with no log source at all (attached by URL): diagnosed from symptoms
    dead_since: list[LogMark | None] = []  # where the windows of dead services begin: the kernel log's too
    for handle in handles:
        manager = handle.manager
        state: ServiceState | None = None
        try:
            state = manager.state()
            props = {"state": state.summary(), **manager.describe()}
        except DflashError as exc:
            props = {"state": f"unknown: {exc}"}
        mark = marks.get(handle.name) or handle.started_mark
        if handle.ready is None and handle.failure is not None:
            # never ready (its wait may have run beside another test): its log since it started
            mark = handle.started_mark
        if state is not None and state.dead:
            # A service that died may have died before this test began (found dead only now): its last lines
            # are older than the test's mark, so the window reaches back to its start, or for an attached
            # unit or container to the end of its log (every manager returns at most `lines`).
            mark = handle.started_mark
            dead_since.append(mark)
        try:
            log = manager.logs_since(mark, lines)
        except DflashError as exc:
            log = f"(could not read the log: {exc})"
        what = "journal" if getattr(manager, "unit", None) else "log"
        if not log.strip() and str(props.get("logs", "")).startswith("none"):
            logless.append(handle.label)
        if log.strip():
            log = clean(log, DIAGNOSIS_INPUT_BYTES, f"{what} tail", "tail")
            texts.append(log)
            title = f"{what} {handle.label} since {_since(mark)}"
            evidence.sections.append((title, clean(log, LOG_BYTES, f"{what} tail", "tail")))
            evidence.logs.append(title)
        ranks = rank_faults(host, handle, errors=(*errors, *((handle.failure,) if handle.failure else ())),
                            log=log)
        if ranks:
            evidence.ranks[handle.name] = ranks
        if state is not None:
            texts.append(clean(state.summary(), ITEM_BYTES, "service state"))
        evidence.sections.append((f"service {handle.label}",
                                  clean("\n".join(f"{k}={v}" for k, v in props.items()), ITEM_BYTES,
                                        "report section")))
    if host.has_host_access and not getattr(host.transport, "_unreachable", None):
        # The earliest window; an attached service found dead has none (since when is unknown): the whole
        # boot.
        windows = [*marks.values(), *dead_since]
        first = None if None in dead_since else min((m.wall_time for m in windows if m), default=None)
        kernel = kernel_log(host, LogMark(first) if first else None)
        if kernel:
            kernel = clean(kernel, ITEM_BYTES, "kernel log excerpt", "tail")
            texts.append(kernel)
            evidence.sections.append((f"kernel log {host.name} (OOM / Xid)", kernel))
    python = host.profile.python
    evidence.missing = missing_log_line(logless)
    subject = rank_subject([fault for faults in evidence.ranks.values() for fault in faults])
    # the rank sentences are evidence too: a rank found stopped by `ps` says so nowhere in a log
    evidence.diagnoses = with_subject(
        diagnose(*texts, subject,
                 values={"python": python, "service": ",".join(h.label for h in handles)},
                 symptoms=texts[0] if logless else "", missing=evidence.missing,
                 mode=service_mode(host, handles)),
        clean(subject, ITEM_BYTES, "diagnosis"))
    if evidence.diagnoses:
        evidence.sections.insert(0, ("dflash diagnosis",
                                     clean(evidence.diagnosis_text(), ITEM_BYTES, "diagnosis")))
    return evidence
