"""Readiness: a service is ready when a real greedy AND a real sampled generation succeeded.

Not `systemctl is-active` (true for a process about to crash) and not `/v1/models` (answers for
minutes of warm-up, and seconds before a crash). On a cold host the first sampled request may
legitimately block for ~1.5 minutes (FlashInfer JIT-compiles its sampling kernel inside the
scheduler: 84–114 s recorded on an H200), so the budgets are long — but the process state is polled
every `POLL_S` the whole time, and death ends the wait at once with its exit status and log tail.

A service attached by URL has no process state (`ServiceState.running is None`): its liveness is
read over HTTP instead (`_wait_over_http`). "Not up yet" is connection refused before it ever
answered, or `/health_generate` 503 during warm-up; "gone" is a request dropped and/or connections
refused after it had answered — conclusive at once (`ServiceGone`, naming the request). A request
accepted and not answered is bounded by the request timeout; only the first sampled request gets
the longer cold-JIT budget, and only while the server keeps answering HTTP and its scheduler is busy
(`/health_generate` not 200: a JIT blocks the scheduler; a stuck request does not).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_dflash import interrupts
from pytest_dflash.client import GREEDY, SAMPLED, DeadlineExceeded, InferenceClient, Sampling
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.errors import (
    ApiError,
    Death,
    DflashError,
    ServiceCrashed,
    ServiceGone,
    ServiceNotReady,
    ServiceRestarted,
)
from pytest_dflash.services.base import LogMark, ServiceManager, ServiceState
from pytest_dflash.services.phases import (
    StartupLog,
    describe_in_progress,
    parse_startup,
    phase_offsets,
    utc_offset_for,
)

POLL_S = 0.25
# After a dropped connection, how long to watch for the death that usually follows
# (real SGLang: 5.2 s from RemoteDisconnected to exit 137).
DEATH_GRACE_S = 15.0
PROGRESS_EVERY_S = 10.0
# Over HTTP (no process state): SGLang's HTTP process serves /v1/models itself, so it answers while
# the scheduler is busy compiling; /health runs a generation through the scheduler (20 s, then 503).
LIVENESS_PATH = "/v1/models"
LIVENESS_EVERY_S = 1.0
LIVENESS_TIMEOUT_S = 2.0
HEALTH_PATH = "/health_generate"
HEALTH_TIMEOUT_S = 30.0  # SGLang answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without output
SCHEDULER_CHECK_EVERY_S = 5.0
# /health_generate is 200 on *any* output, our own request's included: the answer to a sampled request that
# just finished compiling may still be in transit. Stuck = still unanswered this long after a 200.
FREE_GRACE_S = 1.0
RETRY_STATUSES = (408, 429)  # the only HTTP answers to a readiness request worth retrying
# A 5xx may be a dying server's last answer (an ASGI app failing while its event loop shuts down): watch
# this long for the death or restart that follows, so the verdict names the crash, not the symptom.
LAST_WORDS_S = 1.5
PHASES = {
    "http": "readiness: waiting for the HTTP server",
    "warmup": "readiness: waiting for /health_generate (warm-up)",
    "greedy": "readiness: first greedy generation",
    "sampled": "readiness: first sampled generation (temperature 0.8, top_k 20, top_p 0.9)",
}

Progress = Callable[[str], None]


class Heartbeat(str):
    """A progress line that repeats a state ("waiting 40s in sampled phase: …"): shown at most once per service
    per ~10 s, not at all with -q (report/progress.py). A ``str``, so every Progress callable takes it."""

    __slots__ = ()


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
    # the cold start by phase (services/phases.py): phase -> seconds from the start of the wait at which it ENDED,
    # in order: process_started, weights_loaded, kv_cache_allocated, cuda_graphs_captured, port_open (from the
    # service's log; port_open from HTTP where there is no log), first_greedy, first_sampled; missing ones omitted
    phases: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"http_s": self.http_s, "greedy_s": self.greedy_s, "sampled_s": self.sampled_s,
                "total_s": self.total_s, "greedy_request_s": self.greedy_request_s,
                "sampled_request_s": self.sampled_request_s, "notes": self.notes,
                "waited_from": round(self.waited_from, 3), "ready_at": round(self.waited_from + self.total_s, 3),
                "phases": dict(self.phases)}


# How often the start-up log is read while the port is not open (a local file, or one journalctl over ssh), and
# how many of its lines: SGLang prints ~50 before its port opens (its server_args line alone is ~8 KB).
STARTUP_LOG_EVERY_S = 1.0
STARTUP_LOG_LINES = 5000


@dataclass
class StartupWatch:
    """The service's start-up by phase, as its log shows it while readiness waits (services/phases.py).

    `on_settled(why)` is called once, when the service's GPU memory is settled: its KV pools are allocated (the
    log's pool lines are over) or, where the log says nothing of them, its port opened (SGLang opens it after all
    of its scheduler's allocations). A neighbour on the same GPU may start from then on (run/state.py).
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
        """The report's phases: the log's (clamped to the port's opening as HTTP saw it), then the generations."""
        out: dict[str, float] = {}
        if self.utc_offset_s is not None:
            out = phase_offsets(self.log, waited_from=self.waited_from, utc_offset_s=self.utc_offset_s,
                                not_after=report.http_s)
        return finish_phases(out, report)


def finish_phases(from_log: dict[str, float], report: ReadyReport) -> dict[str, float]:
    """`from_log` completed by what HTTP measured: the port (where the log has no line), first greedy, sampled."""
    out = dict(from_log)
    if "port_open" not in out and report.http_s is not None:
        out["port_open"] = round(report.http_s, 3)
    if report.greedy_s is not None:
        out["first_greedy"] = round(report.greedy_s, 3)
    if report.sampled_s is not None:
        out["first_sampled"] = round(report.sampled_s, 3)
    return out


class _InFlight:
    """One request running in a background thread, so the state can be polled meanwhile."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.started = time.monotonic()
        self.result: object | None = None
        self.error: ApiError | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name="dflash-ready-request", daemon=True)
        self._thread.start()

    @classmethod
    def generation(cls, client: InferenceClient, sampling: Sampling, native: bool, timeout_s: float) -> _InFlight:
        return cls(lambda: client.probe_generation(sampling, native=native, timeout_s=timeout_s))

    @classmethod
    def status(cls, client: InferenceClient, path: str, timeout_s: float) -> _InFlight:
        """GET `path`; the result is its HTTP status."""
        return cls(lambda: client.request("GET", path, timeout_s=timeout_s).status_code)

    def _run(self, call: Callable[[], object]) -> None:
        try:
            self.result = call()
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


SAMPLED_PENDING = "sampled generation (top_k=20, top_p=0.9) not answered yet"


def _generation_answered(report: ReadyReport, phase: str, request_s: float, elapsed_s: float) -> bool:
    """Record a readiness generation that was answered; True when that completes readiness (the sampled one)."""
    if phase == "greedy":
        report.greedy_s, report.greedy_request_s = elapsed_s, request_s
        return False
    report.sampled_s, report.sampled_request_s = elapsed_s, request_s
    report.total_s = elapsed_s
    if request_s > 30:
        report.notes.append(f"first sampled request took {format_seconds(request_s)} (a cold kernel JIT?)")
    return True


@dataclass
class ReadinessWatcher:
    """Waits for one service to be ready, failing fast when it dies or restarts."""

    service: ServiceManager
    client: InferenceClient
    native: bool | None  # None: find out from /server_info once the server answers HTTP
    budget_s: float
    sampled_budget_s: float
    log_lines: int = 200
    progress: Progress | None = None
    log_mark: LogMark | None = None
    poll_s: float = POLL_S
    request_timeout_s: float = 60.0
    # True once the run is ending (its cleanup began): a wait in a pre-flight thread ends then, not at its budget
    # (the process exits only when that thread does)
    abandoned: Callable[[], bool] | None = None
    # called once when the service's GPU memory is settled (StartupWatch): a neighbour on its GPU may start
    on_settled: Callable[[str], None] | None = None
    progress_every_s: float = PROGRESS_EVERY_S
    _base_restarts: int | None = None

    def _check_abandoned(self, phase: str, started: float) -> None:
        if self.abandoned is not None and self.abandoned():
            raise ServiceNotReady(self.service.name, time.monotonic() - started,
                                  f"{phase} phase: the run ended before the service was ready")

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

    def _watch_for_death(self, phase: str, seconds: float) -> None:
        """Poll the state for `seconds`: raises ServiceCrashed / ServiceRestarted if it dies or restarts meanwhile."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            interrupts.raise_if_lost()
            time.sleep(self.poll_s)
            self._check_alive(phase)

    def _say(self, message: str, *, heartbeat: bool = False) -> None:
        if self.progress:
            line = f"{self.service.name}: {message}"
            self.progress(Heartbeat(line) if heartbeat else line)

    def wait(self) -> ReadyReport:
        if self.service.state().running is None:
            return self._wait_over_http()  # attached by URL: no process to ask
        report = ReadyReport()
        started = time.monotonic()
        startup = StartupWatch(self.service, self.log_mark, report.waited_from, self.on_settled)
        deadline = started + self.budget_s
        phase = "http"
        problem = "no HTTP answer yet"
        in_flight: _InFlight | None = None
        dropped_at: float | None = None
        next_progress = started + self.progress_every_s
        next_attempt = started
        while True:
            interrupts.raise_if_lost()
            self._check_abandoned(phase, started)
            now = time.monotonic()
            self._check_alive(phase)
            if phase == "http":
                startup.poll(now)
            if dropped_at is not None and now - dropped_at > DEATH_GRACE_S:
                dropped_at = None  # the drop was not followed by death: retry the request below
            if now > deadline:
                raise ServiceNotReady(self.service.name, now - started, f"{phase} phase: {problem}",
                                      self.service.logs_since(self.log_mark, self.log_lines))
            if now >= next_progress:
                extra = f"; request in flight for {format_seconds(in_flight.age)}" if in_flight else ""
                hint = (" (a new SGLang process's first sampled request took up to 256 s on an H200, also with warm "
                        "JIT caches; FlashInfer builds under one host-wide lock, so another process's JIT build "
                        "stalls it too)" if phase == "sampled" else "")
                doing = f"{startup.doing()}; " if phase == "http" and startup.doing() else ""
                self._say(f"waiting {format_seconds(now - started)} in {phase} phase: {doing}{problem}{extra}{hint}",
                          heartbeat=True)
                next_progress = now + self.progress_every_s
            if phase == "http" and now >= next_attempt:
                try:
                    response = self.client.request("GET", "/v1/models", timeout_s=2)
                    if response.status_code == 200:
                        report.http_s = now - started
                        startup.port_opened()
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
                    in_flight = _InFlight.generation(self.client, sampling, self.native is not False, limit)
                elif in_flight is not None and in_flight.done:
                    finished, in_flight = in_flight, None
                    if finished.result is not None:
                        if _generation_answered(report, phase, finished.age, now - started):
                            report.phases = startup.phases(report)
                            return report
                        phase, problem = "sampled", SAMPLED_PENDING
                        continue
                    error = finished.error
                    assert error is not None
                    problem = str(error)
                    if error.dropped and "cannot connect" not in error.message:
                        # Real SGLang drops in-flight requests when its scheduler dies, then exits ~5 s later.
                        dropped_at = now
                        self._say(f"{phase} request got no HTTP response; watching for the process to die")
                    elif error.status is not None and error.status not in RETRY_STATUSES:
                        # A 200 with a garbage body, a 4xx or a 5xx: waiting longer will not fix it.
                        if error.status >= 500:
                            self._watch_for_death(phase, LAST_WORDS_S)
                        raise ServiceNotReady(self.service.name, time.monotonic() - started,
                                              f"{phase} request rejected: {error}",
                                              self.service.logs_since(self.log_mark, self.log_lines))
                    next_attempt = now + 0.5
            if in_flight is not None and not in_flight.done:
                in_flight.wait(self.poll_s)  # wakes as soon as the answer is in: an up service is ready at once
            elif phase == "http" or now < next_attempt or dropped_at is not None:
                time.sleep(self.poll_s)

    # ---- attached by URL: liveness over HTTP ------------------------------------------------------

    def _wait_over_http(self) -> ReadyReport:
        """Readiness with no process state: death and silence read from HTTP (see the module docstring)."""
        report = ReadyReport()
        started = time.monotonic()
        deadline = started + self.budget_s
        live = HttpLiveness(self.client)
        phase, problem = "http", "no HTTP answer yet (connection refused: not up yet)"
        in_flight: _InFlight | None = None
        scheduler: _InFlight | None = None  # /health_generate while a sampled request is overdue
        request = ""  # the request in flight (or the last one sent), as a person would write it
        dropped_at: float | None = None
        drops = 0
        next_attempt = started
        next_progress = started + PROGRESS_EVERY_S
        next_scheduler_check = 0.0
        free_at: float | None = None  # when /health_generate said 200 with the sampled request unanswered
        while True:
            interrupts.raise_if_lost()
            self._check_abandoned(phase, started)
            now = time.monotonic()
            if now > deadline:
                raise ServiceNotReady(self.service.name, now - started, f"{phase} phase: {problem}")
            if now >= next_progress:
                extra = f"; {request} in flight for {format_seconds(in_flight.age)}" if in_flight else ""
                alive = f"; it answered HTTP {format_seconds(now - live.answered_at)} ago" if live.answered_at else ""
                self._say(f"waiting {format_seconds(now - started)} in {phase} phase: {problem}{extra}{alive}",
                          heartbeat=True)
                next_progress = now + PROGRESS_EVERY_S
            if live.answered_at is not None and (in_flight is not None or dropped_at is not None) and (
                    now >= live.next_probe):
                verdict = live.probe(every_s=self.poll_s if dropped_at is not None else LIVENESS_EVERY_S)
                if verdict == "refused":
                    seen = ("no HTTP response (connection dropped), then connections refused" if dropped_at is not None
                            else "connections refused while it was in flight")
                    raise self._gone(phase, request, seen, live)
                if live.silent_for() > self.request_timeout_s:
                    raise ServiceNotReady(self.service.name, now - started,
                                          f"{phase} phase: the server stopped answering HTTP: no answer to GET "
                                          f"{LIVENESS_PATH} for {format_seconds(live.silent_for())} "
                                          f"(request timeout {format_seconds(self.request_timeout_s)})")
            if dropped_at is not None:
                if now - dropped_at <= DEATH_GRACE_S:
                    time.sleep(self.poll_s)
                    continue
                dropped_at, drops = None, drops + 1  # still answering: the drop was not a death
                if drops >= 2:
                    raise ServiceNotReady(self.service.name, now - started,
                                          f"{phase} phase: {request} got no HTTP response twice, although the "
                                          "server kept answering HTTP")
            if phase == "http":
                if now >= next_attempt:
                    phase, problem = self._http_phase(live, report, started, problem)
                    if phase != "http":
                        next_attempt = now  # straight on to the next phase's request, not a poll later
                        continue
                    next_attempt = now + self.poll_s
                time.sleep(self.poll_s)
                continue
            if in_flight is None:
                if now < next_attempt:
                    time.sleep(min(self.poll_s, next_attempt - now))
                    continue
                in_flight, request = self._send(phase, deadline - now)
                continue
            if not in_flight.done:
                limit = self._limit(phase)
                if in_flight.age > limit:
                    raise self._silent(phase, request, in_flight.age, limit, started)
                if phase == "sampled" and in_flight.age > self.request_timeout_s:
                    # Past the request timeout only a compiling JIT may hold a sampled request; a JIT
                    # blocks the scheduler, so /health_generate must not be 200 meanwhile.
                    if scheduler is not None and scheduler.done:
                        if scheduler.error is None and scheduler.result == 200:
                            free_at = free_at or now
                        if free_at is not None and now - free_at > FREE_GRACE_S:
                            raise ServiceNotReady(
                                self.service.name, now - started,
                                f"sampled phase: {request} not answered after {format_seconds(in_flight.age)} "
                                f"while {HEALTH_PATH} answers 200: the scheduler is free, so this is not a "
                                "JIT compiling: the request is stuck")
                        if free_at is None:
                            scheduler = None
                    if scheduler is None and now >= next_scheduler_check and self.native:
                        scheduler = _InFlight.status(self.client, HEALTH_PATH, LIVENESS_TIMEOUT_S + 1)
                        next_scheduler_check = now + SCHEDULER_CHECK_EVERY_S
                in_flight.wait(self.poll_s)
                continue
            finished, in_flight = in_flight, None
            if finished.error is None:
                if phase == "warmup":
                    status = finished.result
                    if status == 200 or (isinstance(status, int) and 400 <= status < 500):
                        # 200: warmed up; a 4xx: no SGLang health route here, the generations will tell.
                        phase, problem = "greedy", "greedy generation not answered yet"
                    elif status == 503:
                        problem = f"{HEALTH_PATH} answered 503 (warming up)"
                        next_attempt = now + 1.0
                    else:
                        raise ServiceNotReady(self.service.name, now - started,
                                              f"warmup phase: {HEALTH_PATH} answered HTTP {status}")
                    continue
                if _generation_answered(report, phase, finished.age, now - started):
                    report.phases = finish_phases({}, report)
                    return report
                phase, problem = "sampled", SAMPLED_PENDING
                continue
            error = finished.error
            problem = str(error)
            if error.cause == "refused":
                raise self._gone(phase, request, "connection refused", live)
            if error.cause == "dropped":
                # Real SGLang drops in-flight requests when its scheduler dies, then exits ~5 s later.
                dropped_at = now
                live.next_probe = now  # ask at once: the refusal usually comes with the drop
                self._say(f"{request} got no HTTP response; watching whether the server is gone")
                continue
            if error.cause == "timeout":
                if phase == "warmup":
                    next_attempt = now  # its own timeout (30 s) is no verdict: liveness is watched meanwhile
                    continue
                raise self._silent(phase, request, finished.age, self._limit(phase), started)
            if error.status is not None and error.status not in RETRY_STATUSES:
                if error.status >= 500:
                    self._refused_within(LAST_WORDS_S, phase, request, f"HTTP {error.status}", live)
                raise ServiceNotReady(self.service.name, time.monotonic() - started,
                                      f"{phase} request rejected: {error}")
            next_attempt = now + 0.5

    def _http_phase(self, live: HttpLiveness, report: ReadyReport, started: float,
                    problem: str) -> tuple[str, str]:
        """One GET /v1/models: the next phase once the server answers 200 (a 4xx/5xx ends readiness)."""
        now = time.monotonic()
        try:
            response = self.client.request("GET", LIVENESS_PATH, timeout_s=LIVENESS_TIMEOUT_S)
        except ApiError as exc:
            if exc.cause == "refused" and live.answered_at is not None:
                raise self._gone("http", "", f"GET {LIVENESS_PATH}: connection refused after it had answered",
                                 live) from None
            if exc.cause == "timeout" and "ConnectTimeout" not in exc.message:
                live.silent_since = live.silent_since or now  # accepted, not answered
                if now - live.silent_since > self.request_timeout_s:
                    raise ServiceNotReady(self.service.name, now - started,
                                          f"http phase: GET {LIVENESS_PATH} accepted and not answered for "
                                          f"{format_seconds(now - live.silent_since)}") from None
            return "http", exc.message
        live.answered(now)
        if response.status_code != 200:
            if response.status_code in RETRY_STATUSES:
                return "http", f"{LIVENESS_PATH} answered HTTP {response.status_code}"
            # An OpenAI-compatible server answers /v1/models from its HTTP process, at once (SGLang:
            # 200 from the moment the port opens): a 4xx/5xx here will not go away by waiting.
            raise ServiceNotReady(self.service.name, now - started,
                                  f"http phase: GET {LIVENESS_PATH} answered HTTP {response.status_code}: "
                                  f"{response.text[:200]}")
        report.http_s = now - started
        if self.native is None:
            try:
                self.native = self.client.server_info(timeout_s=5) is not None
            except ApiError:
                self.native = False
        if self.native:
            return "warmup", f"{HEALTH_PATH} not answered yet"
        return "greedy", "greedy generation not answered yet"

    def _send(self, phase: str, remaining_s: float) -> tuple[_InFlight, str]:
        """Start the phase's request in a thread; returns it and its description."""
        if phase == "warmup":
            return _InFlight.status(self.client, HEALTH_PATH, HEALTH_TIMEOUT_S), f"GET {HEALTH_PATH}"
        sampling = GREEDY if phase == "greedy" else SAMPLED
        limit = max(1.0, min(remaining_s, self._limit(phase) + 1.0))  # the loop decides; the thread must end
        native = bool(self.native)
        request = describe_request(sampling, native=native)
        return _InFlight.generation(self.client, sampling, native, limit), request

    def _limit(self, phase: str) -> float:
        """How long the phase's request may go unanswered while the server answers HTTP."""
        if phase == "sampled":
            return max(self.request_timeout_s, self.sampled_budget_s)  # the cold-JIT budget
        if phase == "warmup":
            return HEALTH_TIMEOUT_S + LIVENESS_TIMEOUT_S
        return self.request_timeout_s

    def _silent(self, phase: str, request: str, age: float, limit: float, started: float) -> ServiceNotReady:
        budget = (f"the first sampled request's cold-JIT budget, sampled_timeout {limit:g}s"
                  if phase == "sampled" and limit > self.request_timeout_s else f"--request-timeout {limit:g}s")
        return ServiceNotReady(self.service.name, time.monotonic() - started,
                               f"{phase} phase: {request} accepted and not answered for {format_seconds(age)} "
                               f"({budget}); the server still answers HTTP")

    def _refused_within(self, seconds: float, phase: str, request: str, answer: str, live: HttpLiveness) -> None:
        """Probe liveness for `seconds`: raises ServiceGone if connections are refused meanwhile."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            interrupts.raise_if_lost()
            time.sleep(self.poll_s)
            if live.probe(every_s=self.poll_s) == "refused":
                raise self._gone(phase, request, f"answered {answer}, then connections refused", live)

    def _gone(self, phase: str, request: str, seen: str, live: HttpLiveness) -> ServiceGone:
        last = time.monotonic() - live.answered_at if live.answered_at is not None else None
        return ServiceGone(self.service.name, Death(detail=f"seen over HTTP: {seen}"), "",
                           PHASES.get(phase, phase), request=request, seen=seen, answered_s_before=last)


def describe_request(sampling: Sampling, *, native: bool) -> str:
    """'POST /generate (max_new_tokens 8, temperature 0.8, top_k 20, top_p 0.9)': the request a readiness
    probe sends, to name the one that killed a server."""
    if native:
        params = sampling.as_sglang()
        return "POST /generate (" + ", ".join(f"{k} {v}" for k, v in params.items()) + ")"
    params = sampling.as_openai()
    return "POST /v1/completions (" + ", ".join(f"{k} {v}" for k, v in params.items()) + ")"


@dataclass
class HttpLiveness:
    """Is a server reached only by URL still there? Judged by a cheap GET its HTTP process answers itself.

    "answered" (any HTTP status), "refused" (nothing listens: conclusive once it had answered),
    "dropped" (closed without answering), "timeout" (accepted or not, no answer in time).
    """

    client: InferenceClient
    answered_at: float | None = None
    silent_since: float | None = None
    next_probe: float = 0.0

    def answered(self, now: float) -> None:
        self.answered_at, self.silent_since = now, None

    def probe(self, *, every_s: float = LIVENESS_EVERY_S) -> str:
        started = time.monotonic()
        self.next_probe = started + every_s
        try:
            self.client.request("GET", LIVENESS_PATH, timeout_s=LIVENESS_TIMEOUT_S)
        except ApiError as exc:
            if exc.cause != "refused":
                self.silent_since = self.silent_since or started
            return exc.cause or "error"
        self.answered(time.monotonic())
        return "answered"

    def silent_for(self) -> float:
        return 0.0 if self.silent_since is None else time.monotonic() - self.silent_since


# ---- after readiness: a request that ran out of its total time ----------------------------------------------

# How long the progress check's /health_generate may take. SGLang answers it 200 as soon as ANY output leaves
# the scheduler after it was sent (a 1-token generation joins the running batch), so an engine that makes
# progress, however slowly, answers within one decode step; a wedged one only after SGLANG_HEALTH_CHECK_TIMEOUT
# (20 s), with 503. Capped by --request-timeout so the whole verdict stays about one request timeout.
PROGRESS_HEALTH_S = 5.0
# /metrics counters that only move when the engine produces output (SGLang 0.5.17 names; summed over labels).
PROGRESS_COUNTERS = ("sglang:generation_tokens_total", "sglang:num_requests_total")
PROGRESS_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput")


def metric_values(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Prometheus text -> {name: value summed over its label sets} for `names` (absent names left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


@dataclass
class EngineProgress:
    """Whether a server's engine still produced output when one of its requests ran out of time."""

    moving: bool | None  # True: output still gets through; False: none at all (stuck); None: cannot tell
    evidence: list[str] = field(default_factory=list)
    per_token_s: float | None = None  # the pace a short streamed probe decoded at (None: not measured, or fast)
    fast: bool = False  # the streamed probe finished within its bound: fresh requests are served at speed

    def describe(self) -> str:
        verdict = {True: "the engine still makes progress",
                   False: "the engine makes no progress at all",
                   None: "whether the engine still makes progress is unknown"}[self.moving]
        return verdict + (f" ({'; '.join(self.evidence)})" if self.evidence else "")


def _metrics(client: InferenceClient, timeout_s: float) -> dict[str, float] | None:
    try:
        return metric_values(client.metrics(timeout_s=timeout_s), PROGRESS_COUNTERS + PROGRESS_GAUGES)
    except ApiError:
        return None  # no --enable-metrics (404), or no answer: no evidence either way


def _pace(client: InferenceClient, *, native: bool, seconds: float) -> tuple[float | None, str, bool]:
    """Seconds per token of a short greedy stream read for at most `seconds` (None: not measured, or the stream
    finished in time: fast); what it showed; and whether it finished in time."""
    sampling = Sampling(max_tokens=32, temperature=0.0, ignore_eos=True)
    try:
        stream = (client.generate_stream("Hello", sampling, timeout_s=seconds) if native
                  else client.completion_stream("Hello", sampling, timeout_s=seconds))
    except DeadlineExceeded as exc:
        if exc.per_token_s is None:
            return None, f"a {seconds:g}s streamed probe got {exc.got}", False
        return exc.per_token_s, (f"a streamed probe: {exc.tokens} tokens in {seconds:g}s, "
                                 f"{exc.per_token_s:.2f} s per token"), False
    except ApiError as exc:
        return None, f"a streamed probe failed: {exc.message}", False
    return None, f"a streamed probe of 32 tokens finished in {stream.elapsed_s:.1f}s", True


def engine_progress(client: InferenceClient, *, native: bool, request_timeout_s: float,
                    measure_pace: bool = False) -> EngineProgress:
    """Ask a server whose request ran out of time whether its engine still makes progress.

    /health_generate (native SGLang): 200 = a 1-token generation got through the scheduler (progress); 503 or
    no answer within PROGRESS_HEALTH_S = it did not. /metrics (when the server exposes it), read before and after:
    generation / request counters that moved = progress; nothing moved while requests are running = none.
    `measure_pace`: when output still gets through, a short streamed greedy probe measures how fast (for a
    request that was not streamed, so its own pace is unknown). Bounded: at most 2 x PROGRESS_HEALTH_S (each
    capped at the request timeout) + 2 x 2 s.
    """
    probe_s = min(PROGRESS_HEALTH_S, max(1.0, request_timeout_s))
    started = time.monotonic()
    before = _metrics(client, 2.0)
    evidence: list[str] = []
    health: bool | None = None
    if native:
        try:
            status = client.health_generate(timeout_s=probe_s)
        except ApiError as exc:
            if exc.cause == "timeout":
                health = False
                evidence.append(f"{HEALTH_PATH}: no answer within {probe_s:g}s (a 1-token generation did not get "
                                "through the scheduler)")
            else:
                evidence.append(f"{HEALTH_PATH}: {exc.message}")
        else:
            health = status == 200
            evidence.append(f"{HEALTH_PATH} answered {status}" + (" (a 1-token generation got through)" if health
                                                                   else " (no output from the scheduler)"))
    metrics: bool | None = None
    if before is not None:
        if time.monotonic() - started < 1.0:
            time.sleep(1.0)  # counters need a moment to move
        after = _metrics(client, 2.0) or {}
        span = time.monotonic() - started
        moved = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in PROGRESS_COUNTERS if name in after}
        running = after.get("sglang:num_running_reqs", 0.0) + after.get("sglang:num_queue_reqs", 0.0)
        said = ", ".join(f"{name.removeprefix('sglang:')} +{delta:g}" for name, delta in moved.items())
        evidence.append(f"/metrics over {span:.1f}s: {said or 'no progress counters'}; "
                        f"{running:g} requests running or queued")
        if any(delta > 0 for delta in moved.values()):
            metrics = True
        elif moved and running > 0:
            metrics = False
    moving = True if (health or metrics) else (False if (health is False or metrics is False) else None)
    per_token: float | None = None
    fast = False
    if measure_pace and moving is not False:
        per_token, said, fast = _pace(client, native=native, seconds=probe_s)
        evidence.append(said)
    return EngineProgress(moving, evidence, per_token, fast)


@dataclass(eq=False)
class ServiceStuck(ServiceNotReady):
    """After readiness, a request ran out of --request-timeout: the service is unusable for the rest of the run
    (stuck, or far too slow), like a death; its remaining tests are blocked naming this."""

    request: str = ""
    got: str = ""
    progress: str = ""
    moving: bool | None = None  # EngineProgress.moving
    per_token_s: float | None = None  # the pace seen (the request's own stream, else the probe's)

    @property
    def kind(self) -> str:
        """"stuck" (no output gets through), "far too slow" (a pace was measured), else "not answering in time"."""
        if self.moving is False:
            return "stuck"
        if self.per_token_s is not None and self.per_token_s > 0:
            return "far too slow"
        return "not answering in time"

    @property
    def what(self) -> str:
        """"stuck", "far too slow (0.50 s per token)", "not answering in time"."""
        return f"{self.kind} ({self.per_token_s:.2f} s per token)" if self.kind == "far too slow" else self.kind

    def __str__(self) -> str:
        return (f"service {self.service} is {self.what}: {self.request} not answered within "
                f"{format_seconds(self.waited_s)} (--request-timeout, total time): got {self.got}; {self.progress}")
