"""What a readiness wait measured (`ReadyReport`) and the watch of the service's start-up log that fills in
its phases and says when its GPU memory is settled (`StartupWatch`; the log's lines are parsed by
services/phases.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_dflash.errors import DflashError
from pytest_dflash.services.base import LogMark, ServiceManager
from pytest_dflash.services.phases import (
    StartupLog,
    describe_in_progress,
    parse_startup,
    phase_offsets,
    utc_offset_for,
)


@dataclass
class ReadyReport:
    """How the service became ready (all times from the start of the wait)."""

    http_s: float | None = None
    greedy_s: float | None = None
    sampled_s: float | None = None
    total_s: float = 0.0
    greedy_request_s: float | None = None
    sampled_request_s: float | None = None
    server_info: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    waited_from: float = field(default_factory=time.time)  # wall clock: when the wait began (unix seconds)
    # the cold start by phase (services/phases.py): phase -> seconds from the start of the wait at which it
    # ENDED, in order: process_started, weights_loaded, kv_cache_allocated, cuda_graphs_captured, port_open
    # (from the service's log; port_open from HTTP where there is no log), first_greedy, first_sampled;
    # missing ones omitted
    phases: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"http_s": self.http_s, "greedy_s": self.greedy_s, "sampled_s": self.sampled_s,
                "total_s": self.total_s, "greedy_request_s": self.greedy_request_s,
                "sampled_request_s": self.sampled_request_s, "notes": self.notes,
                "waited_from": round(self.waited_from, 3),
                "ready_at": round(self.waited_from + self.total_s, 3), "phases": dict(self.phases)}




# how many of its lines: SGLang prints ~50 before its port opens (its server_args line alone is ~8 KB).
STARTUP_LOG_EVERY_S = 1.0
STARTUP_LOG_LINES = 5000


@dataclass
class StartupWatch:
    """The service's start-up by phase, as its log shows it while readiness waits (services/phases.py).

    `on_settled(why)` is called once, when the service's GPU memory is settled: its KV pools are allocated
    (the log's pool lines are over) or, where the log says nothing of them, its port opened (SGLang opens it
    after all of its scheduler's allocations). A neighbour on the same GPU may start from then on
    (run/state.py, run/handle.py).
    """

    service: ServiceManager
    log_mark: LogMark | None
    waited_from: float  # unix time the wait began
    on_settled: Callable[[str], None] | None = None
    log: StartupLog = field(default_factory=StartupLog)
    utc_offset_s: float | None = None
    settled_by: str | None = None
    _next_read: float = 0.0

    def poll(self, now: float, *, force: bool = False) -> None:
        """Read the log again if it is time to (monotonic `now`) and the port is not open yet."""
        if (now < self._next_read and not force) or "port_open" in self.log.ends or self.log_mark is None:
            return  # no mark: not started by this run (attached), its log holds an older start-up, if any
        self._next_read = now + STARTUP_LOG_EVERY_S
        try:
            text = self.service.logs_since(self.log_mark, STARTUP_LOG_LINES)
        except DflashError:
            return  # no log this time: the port opening still settles it
        log = parse_startup(text)
        if log.last_line is not None and self.utc_offset_s is None:
            self.utc_offset_s = utc_offset_for(log.last_line, time.time())
        self.log = log
        if "kv_cache_allocated" in log.ends:
            self.settle("its KV cache was allocated (its log's pool lines)")

    def port_opened(self) -> None:
        self.poll(time.monotonic(), force=True)  # the lines up to the port, for the phases
        self.settle("its port opened (after its KV pools and CUDA graphs)")

    def settle(self, why: str) -> None:
        if self.settled_by is None:
            self.settled_by = why
            if self.on_settled is not None:
                self.on_settled(why)

    def doing(self) -> str:
        """What the start-up is doing now, for a heartbeat ('' when the log says nothing)."""
        if self.utc_offset_s is None:
            return ""
        return describe_in_progress(self.log, now=time.time(), waited_from=self.waited_from,
                                    utc_offset_s=self.utc_offset_s)

    def phases(self, report: ReadyReport) -> dict[str, float]:
        """The report's phases: the log's (clamped to the port's opening as HTTP saw it), then the
        generations."""
        out: dict[str, float] = {}
        if self.utc_offset_s is not None:
            out = phase_offsets(self.log, waited_from=self.waited_from, utc_offset_s=self.utc_offset_s,
                                not_after=report.http_s)
        return finish_phases(out, report)


def finish_phases(from_log: dict[str, float], report: ReadyReport) -> dict[str, float]:
    """`from_log` completed by what HTTP measured: the port (where the log has no line), first greedy,
    sampled."""
    out = dict(from_log)
    if "port_open" not in out and report.http_s is not None:
        out["port_open"] = round(report.http_s, 3)
    if report.greedy_s is not None:
        out["first_greedy"] = round(report.greedy_s, 3)
    if report.sampled_s is not None:
        out["first_sampled"] = round(report.sampled_s, 3)
    return out

