"""Readiness: a service is ready when a real greedy AND a real sampled generation succeeded.

Not `systemctl is-active` (true for a process about to crash) and not `/v1/models` (answers for
minutes of warm-up, and seconds before a crash). On a cold host the first sampled request may
legitimately block for ~1.5 minutes (FlashInfer JIT-compiles its sampling kernel inside the
scheduler: 84–114 s recorded on an H200), so the budgets are long — but the process state is polled
every `POLL_S` the whole time, and death ends the wait at once with its exit status and log tail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_dflash.client import GREEDY, SAMPLED, Generation, InferenceClient, Sampling
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.errors import ApiError, ServiceCrashed, ServiceNotReady, ServiceRestarted
from pytest_dflash.services.base import LogMark, ServiceManager, ServiceState

POLL_S = 0.25
# After a dropped connection, how long to watch for the death that usually follows
# (real SGLang: 5.2 s from RemoteDisconnected to exit 137).
DEATH_GRACE_S = 15.0
PROGRESS_EVERY_S = 10.0
PHASES = {
    "http": "readiness: waiting for the HTTP server",
    "greedy": "readiness: first greedy generation",
    "sampled": "readiness: first sampled generation (temperature 0.8, top_k 20, top_p 0.9)",
}

Progress = Callable[[str], None]


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

    def as_dict(self) -> dict[str, object]:
        return {"http_s": self.http_s, "greedy_s": self.greedy_s, "sampled_s": self.sampled_s,
                "total_s": self.total_s, "greedy_request_s": self.greedy_request_s,
                "sampled_request_s": self.sampled_request_s, "notes": self.notes}


class _InFlight:
    """One generation request running in a background thread, so the state can be polled meanwhile."""

    def __init__(self, client: InferenceClient, sampling: Sampling, native: bool, timeout_s: float) -> None:
        self.started = time.monotonic()
        self.result: Generation | None = None
        self.error: ApiError | None = None
        self._thread = threading.Thread(target=self._run, args=(client, sampling, native, timeout_s),
                                        name="dflash-ready-request", daemon=True)
        self._thread.start()

    def _run(self, client: InferenceClient, sampling: Sampling, native: bool, timeout_s: float) -> None:
        try:
            self.result = client.probe_generation(sampling, native=native, timeout_s=timeout_s)
        except ApiError as exc:
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float) -> None:
        """Return when the request finished, or after `timeout_s` (the state must be polled meanwhile)."""
        self._thread.join(timeout_s)

    @property
    def age(self) -> float:
        return time.monotonic() - self.started


@dataclass
class ReadinessWatcher:
    """Waits for one service to be ready, failing fast when it dies or restarts."""

    service: ServiceManager
    client: InferenceClient
    native: bool
    budget_s: float
    sampled_budget_s: float
    log_lines: int = 200
    progress: Progress | None = None
    log_mark: LogMark | None = None
    poll_s: float = POLL_S
    _base_restarts: int | None = None

    def _check_alive(self, phase: str) -> ServiceState:
        state = self.service.state()
        if self._base_restarts is None:
            self._base_restarts = state.restarts
        if state.death is not None:
            # journald may need a moment to receive the last lines of a dying process.
            time.sleep(0.2)
            raise ServiceCrashed(self.service.name, state.death,
                                 self.service.logs_since(self.log_mark, self.log_lines), PHASES.get(phase, phase))
        if state.restarts > self._base_restarts:
            raise ServiceRestarted(self.service.name, self._base_restarts, state.restarts,
                                   self.service.logs_since(self.log_mark, self.log_lines))
        return state

    def _say(self, message: str) -> None:
        if self.progress:
            self.progress(f"{self.service.name}: {message}")

    def wait(self) -> ReadyReport:
        report = ReadyReport()
        started = time.monotonic()
        deadline = started + self.budget_s
        phase = "http"
        problem = "no HTTP answer yet"
        in_flight: _InFlight | None = None
        dropped_at: float | None = None
        next_progress = started + PROGRESS_EVERY_S
        next_attempt = started
        while True:
            now = time.monotonic()
            self._check_alive(phase)
            if dropped_at is not None and now - dropped_at > DEATH_GRACE_S:
                dropped_at = None  # the drop was not followed by death: retry the request below
            if now > deadline:
                raise ServiceNotReady(self.service.name, now - started, f"{phase} phase: {problem}",
                                      self.service.logs_since(self.log_mark, self.log_lines))
            if now >= next_progress:
                extra = f"; request in flight for {format_seconds(in_flight.age)}" if in_flight else ""
                hint = " (a cold FlashInfer sampling JIT takes ~1.5 min on an H200)" if phase == "sampled" else ""
                self._say(f"waiting {format_seconds(now - started)} in {phase} phase: {problem}{extra}{hint}")
                next_progress = now + PROGRESS_EVERY_S
            if phase == "http" and now >= next_attempt:
                try:
                    response = self.client.request("GET", "/v1/models", timeout_s=2)
                    if response.status_code == 200:
                        report.http_s = now - started
                        phase, problem = "greedy", "greedy generation not answered yet"
                        continue  # straight on to the first generation
                    problem = f"/v1/models answered HTTP {response.status_code}"
                except ApiError as exc:
                    problem = exc.message
                next_attempt = now + self.poll_s
            elif phase in ("greedy", "sampled") and dropped_at is None:
                if in_flight is None and now >= next_attempt:
                    sampling = GREEDY if phase == "greedy" else SAMPLED
                    remaining = max(1.0, deadline - now)
                    limit = remaining if phase == "greedy" else min(remaining, self.sampled_budget_s)
                    in_flight = _InFlight(self.client, sampling, self.native, limit)
                elif in_flight is not None and in_flight.done:
                    finished, in_flight = in_flight, None
                    if finished.result is not None:
                        if phase == "greedy":
                            report.greedy_s, report.greedy_request_s = now - started, finished.age
                            phase, problem = "sampled", "sampled generation (top_k=20, top_p=0.9) not answered yet"
                            continue
                        report.sampled_s, report.sampled_request_s = now - started, finished.age
                        report.total_s = now - started
                        if finished.age > 30:
                            report.notes.append(f"first sampled request took {format_seconds(finished.age)} "
                                                "(a cold kernel JIT?)")
                        return report
                    error = finished.error
                    assert error is not None
                    problem = str(error)
                    if error.dropped and "cannot connect" not in error.message:
                        # Real SGLang drops in-flight requests when its scheduler dies, then exits ~5 s later.
                        dropped_at = now
                        self._say(f"{phase} request got no HTTP response; watching for the process to die")
                    elif error.status is not None and (error.status < 300 or (
                            400 <= error.status < 500 and error.status not in (408, 429))):
                        # A 200 with a garbage body, or a 4xx: waiting longer will not fix it.
                        raise ServiceNotReady(self.service.name, now - started,
                                              f"{phase} request rejected: {error}",
                                              self.service.logs_since(self.log_mark, self.log_lines))
                    next_attempt = now + 0.5
            if in_flight is not None and not in_flight.done:
                in_flight.wait(self.poll_s)  # wakes as soon as the answer is in: an up service is ready at once
            elif phase == "http" or now < next_attempt or dropped_at is not None:
                time.sleep(self.poll_s)
