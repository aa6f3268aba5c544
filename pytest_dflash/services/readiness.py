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

Two later SGLang releases change what the health routes say (services/health.py): with
SGLANG_DIAG_BYPASS_HEALTH_GENERATE set (0.5.19+) /health_generate answers 200 without a generation, so the
"scheduler is free" check is not made (the sampled request then has its whole cold-JIT budget, and the
failure says why); and a wait that stalls asks GET /ready (0.5.20+: 503 = paused, shutting down or unhealthy;
no generation) for its evidence. Ready is still a real greedy and a real sampled generation.

This module holds the wait loop (`ReadinessWatcher`) and its heartbeat's own clock (`_Pacemaker`: every 10 s
the loop's current state, also while the loop is inside one call); its probes are in services/liveness.py,
what it reports and the start-up log it reads meanwhile in services/startup.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pytest_dflash import interrupts
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import GREEDY, SAMPLED, Sampling
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
from pytest_dflash.scrub.bounds import scrub
from pytest_dflash.services.base import LogMark, ServiceManager, ServiceState
from pytest_dflash.services.events import Heartbeat, Progress
from pytest_dflash.services.health import ask_ready
from pytest_dflash.services.liveness import (
    HEALTH_PATH,
    LIVENESS_EVERY_S,
    LIVENESS_PATH,
    LIVENESS_TIMEOUT_S,
    HttpLiveness,
    InFlight,
)
from pytest_dflash.services.phases import nccl_init_stuck
from pytest_dflash.services.ranks import rank_on_gpu, ranks_named_in_log
from pytest_dflash.services.startup import ReadyReport, StartupWatch, finish_phases

POLL_S = 0.25
# After a dropped connection, how long to watch for the death that usually follows
# (real SGLang: 5.2 s from RemoteDisconnected to exit 137).
DEATH_GRACE_S = 15.0
PROGRESS_EVERY_S = 10.0
# A heartbeat says so when the wait has been inside one check (a call that has not returned) this long.
STEP_SLOW_S = 3.0
# /health_generate runs a generation through the scheduler (20 s, then 503).
HEALTH_TIMEOUT_S = 30.0  # SGLang answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without output
SCHEDULER_CHECK_EVERY_S = 5.0
# /health_generate is 200 on *any* output, our own request's included: the answer to a sampled request that
# just finished compiling may still be in transit. Stuck = still unanswered this long after a 200.
FREE_GRACE_S = 1.0
RETRY_STATUSES = (408, 429)  # the only HTTP answers to a readiness request worth retrying
# Attached by URL, nothing here starts the server, so an answer that asks to be retried (RETRY_STATUSES) to
# every readiness request for this long, at least this many times in a row, is its answer and not a phase of
# a start-up: the wait ends naming it (status and the body's first bytes) instead of spending the whole
# ready_timeout (15 min by default). SGLang's own warm-up answer (/health_generate 503) is still waited for.
ATTACHED_RETRY_GRACE_S = 20.0
ATTACHED_RETRY_ANSWERS = 3
ANSWER_EXCERPT_BYTES = 200
# A 5xx may be a dying server's last answer (an ASGI app failing while its event loop shuts down): watch
# this long for the death or restart that follows, so the verdict names the crash, not the symptom.
LAST_WORDS_S = 1.5
PHASES = {
    "http": "readiness: waiting for the HTTP server",
    "warmup": "readiness: waiting for /health_generate (warm-up)",
    "greedy": "readiness: first greedy generation",
    "sampled": "readiness: first sampled generation (temperature 0.8, top_k 20, top_p 0.9)",
}

SAMPLED_PENDING = "sampled generation (top_k=20, top_p=0.9) not answered yet"


def answer_excerpt(body: str) -> str:
    """The first bytes of an answer's body as a message may quote them: secrets masked, safe to print."""
    return scrub(body, ANSWER_EXCERPT_BYTES, "answer", keep="head") if body else "(empty body)"


@dataclass
class _RetryAnswers:
    """Retryable answers (RETRY_STATUSES) in a row to an attached server's readiness requests."""

    grace_s: float = ATTACHED_RETRY_GRACE_S
    since: float | None = None
    count: int = 0

    def reset(self) -> None:
        self.since, self.count = None, 0

    def seen(self, now: float, what: str) -> str | None:
        """Count one; the reason to stop waiting (what it keeps answering) once the grace is spent, else
        None."""
        self.since = self.since if self.since is not None else now
        self.count += 1
        if self.count < ATTACHED_RETRY_ANSWERS or now - self.since < self.grace_s:
            return None
        return (f"{what} ({self.count} answers in a row over {format_seconds(now - self.since)}); the server "
                "is attached by URL, so nothing here is starting it: waiting out ready_timeout would not "
                "change its answer")


def _generation_answered(report: ReadyReport, phase: str, request_s: float, elapsed_s: float) -> bool:
    """Record a readiness generation that was answered; True when that completes readiness (the sampled
    one)."""
    if phase == "greedy":
        report.greedy_s, report.greedy_request_s = elapsed_s, request_s
        return False
    report.sampled_s, report.sampled_request_s = elapsed_s, request_s
    report.total_s = elapsed_s
    if request_s > 30:
        report.notes.append(f"first sampled request took {format_seconds(request_s)} (a cold kernel JIT?)")
    return True



class _Pacemaker:
    """Says a wait's heartbeat every `every_s` from a thread of its own, so a heartbeat never waits for the
    wait loop: a loop inside one long call (a metadata route that does not answer, a slow remote command) is
    still heard on time. None is said once the wait has ended (its "ready" or "failed" line comes next)."""

    def __init__(self, say: Callable[[], None], every_s: float) -> None:
        self._say = say
        self._every_s = every_s
        self.due = time.monotonic() + every_s  # the next heartbeat (`pace` moves it)
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readiness heartbeat", daemon=True)

    def __enter__(self) -> _Pacemaker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # a heartbeat being said finishes first
            self._ended.set()

    def pace(self, started: float) -> None:
        """The wait began at `started` (monotonic): its heartbeats come every `every_s` from then."""
        self.due = started + self._every_s

    def _run(self) -> None:
        while not self._ended.wait(max(0.0, self.due - time.monotonic())):
            if time.monotonic() < self.due:
                continue  # moved later meanwhile (pace)
            with self._lock:
                if self._ended.is_set():
                    return
                self._say()
            self.due = time.monotonic() + self._every_s


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
    # True once the run is ending (its cleanup began): a wait in a pre-flight thread ends then, not at its
    # budget (the process exits only when that thread does)
    abandoned: Callable[[], bool] | None = None
    # called once when the service's GPU memory is settled (StartupWatch): a neighbour on its GPU may start
    on_settled: Callable[[str], None] | None = None
    progress_every_s: float = PROGRESS_EVERY_S
    # why /health_generate proves nothing here (SGLANG_DIAG_BYPASS_HEALTH_GENERATE in the service's
    # environment: services/health.py); None: it proves output got through the scheduler
    health_bypassed: str | None = None
    # attached by URL: how long 408 / 429 to every readiness request is waited out (see RETRY_STATUSES)
    attached_retry_grace_s: float = ATTACHED_RETRY_GRACE_S
    # a tensor-parallel start-up: a rank in NCCL init longer than this fails the wait, naming it and its GPU
    nccl_init_budget_s: float = 120.0
    gpus: tuple[int, ...] = ()  # the service's GPUs: rank i runs on gpus[i]
    # how the progress lines name the service ("host/service", as its other lines do); its name when empty
    label: str = ""
    _base_restarts: int | None = None
    _version: str | None = None  # /server_info version, once read
    # the running wait's heartbeat text and its pacemaker, and when its loop began its current pass
    _beat: Callable[[], str] | None = None
    _pacemaker: _Pacemaker | None = None
    _pass_at: float = 0.0
    # the running wait's report and start-up watch: what it had seen when it failed (`stopped`)
    _report: ReadyReport | None = None
    _startup: StartupWatch | None = None
    _started: float = 0.0
    # set when the wait failed: how far the start-up got (its phases so far, `total_s` = the time waited), so
    # a report can draw the service's timeline up to where it stopped
    stopped: ReadyReport | None = None

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
            log = self.service.logs_since(self.log_mark, self.log_lines)
            raise ServiceCrashed(self.service.name, state.death, log, PHASES.get(phase, phase),
                                 ranks=tuple(ranks_named_in_log(log, self.gpus)))
        if state.restarts > self._base_restarts:
            raise ServiceRestarted(self.service.name, self._base_restarts, state.restarts,
                                   self.service.logs_since(self.log_mark, self.log_lines))
        return state

    def _watch_for_death(self, phase: str, seconds: float) -> None:
        """Poll the state for `seconds`: raises ServiceCrashed / ServiceRestarted if it dies or restarts
        meanwhile."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            interrupts.raise_if_lost()
            time.sleep(self.poll_s)
            self._check_alive(phase)

    def _check_nccl_init(self, startup: StartupWatch, started: float) -> None:
        """A rank stuck in NCCL init past its budget ends the wait at once, naming the rank and its GPU:
        SGLang itself would wait for torch's distributed timeout (10 min), then die without naming a rank."""
        if startup.utc_offset_s is None:
            return
        stuck, longest = nccl_init_stuck(startup.log, now=time.time(), utc_offset_s=startup.utc_offset_s,
                                         budget_s=self.nccl_init_budget_s)
        if not stuck:
            return
        others = [r.label for r in startup.log.ranks.values() if r not in stuck]
        raise ServiceNotReady(
            self.service.name, time.monotonic() - started,
            f"start-up: {', '.join(rank_on_gpu(r.label, self.gpus) for r in stuck)} stuck in NCCL init "
            f"(Init torch distributed begin, no 'ends') for {format_seconds(longest)}, past "
            f"nccl_init_timeout {format_seconds(self.nccl_init_budget_s)} of a tensor-parallel start-up"
            + (f"; {', '.join(others)} got past it" if others else "; no rank got past it"),
            self.service.logs_since(self.log_mark, self.log_lines))

    def _say(self, message: str, *, heartbeat: bool = False) -> None:
        if self.progress:
            line = f"{self.label or self.service.name}: {message}"
            self.progress(Heartbeat(line) if heartbeat else line)

    def _pace(self, beat: Callable[[], str], started: float) -> None:
        """The loop that began at `started` says `beat()` every progress_every_s (the pacemaker thread)."""
        self._beat = beat
        if self._pacemaker is not None:
            self._pacemaker.pace(started)

    def _heartbeat(self) -> None:
        beat = self._beat
        if beat is None:
            return
        text = beat()
        if (stuck := time.monotonic() - self._pass_at) > STEP_SLOW_S:
            text += f"; a check has not returned for {format_seconds(stuck)}"
        self._say(text, heartbeat=True)

    def wait(self) -> ReadyReport:
        self._beat, self._pass_at = None, time.monotonic()
        self._pacemaker = _Pacemaker(self._heartbeat, self.progress_every_s) if self.progress else None
        self._report, self._startup, self._started = None, None, time.monotonic()
        try:
            with self._pacemaker or contextlib.nullcontext():
                if self.service.state().running is None:
                    return self._wait_over_http()  # attached by URL: no process to ask
                return self._wait_for_process()
        except DflashError:
            self.stopped = self._stopped_report()
            raise

    def _stopped_report(self) -> ReadyReport:
        """The failed wait's report: the phases it saw end (log and HTTP), `total_s` the time it waited."""
        report = self._report or ReadyReport()
        report.total_s = time.monotonic() - self._started
        # the log as already read (no new read: the service may be gone), then what HTTP saw
        report.phases = (self._startup.phases(report) if self._startup is not None
                         else finish_phases({}, report))
        return report

    def _wait_for_process(self) -> ReadyReport:
        """Readiness of a service with a process (or unit, or container) to ask: death read from its state."""
        report = ReadyReport()
        started = time.monotonic()
        startup = StartupWatch(self.service, self.log_mark, report.waited_from, self.on_settled)
        self._report, self._startup = report, startup
        deadline = started + self.budget_s
        phase = "http"
        problem = "no HTTP answer yet"
        in_flight: InFlight | None = None
        dropped_at: float | None = None
        next_attempt = started

        def beat() -> str:
            now = time.monotonic()
            extra = f"; request in flight for {format_seconds(in_flight.age)}" if in_flight else ""
            hint = (" (a new SGLang process's first sampled request took up to 256 s on an H200, also "
                    "with warm JIT caches; FlashInfer builds under one host-wide lock, so another "
                    "process's JIT build stalls it too)" if phase == "sampled" else "")
            doing = f"{startup.doing()}; " if phase == "http" and startup.doing() else ""
            return f"waiting {format_seconds(now - started)} in {phase} phase: {doing}{problem}{extra}{hint}"

        self._pace(beat, started)
        while True:
            interrupts.raise_if_lost()
            self._check_abandoned(phase, started)
            now = self._pass_at = time.monotonic()
            self._check_alive(phase)
            if phase == "http":
                startup.poll(now)
                self._check_nccl_init(startup, started)
            if dropped_at is not None and now - dropped_at > DEATH_GRACE_S:
                dropped_at = None  # the drop was not followed by death: retry the request below
            if now > deadline:
                raise ServiceNotReady(self.service.name, now - started,
                                      f"{phase} phase: {problem}{self._ready_said(phase)}",
                                      self.service.logs_since(self.log_mark, self.log_lines))
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
                    in_flight = InFlight.generation(self.client, sampling, self.native is not False, limit)
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
                # wakes as soon as the answer is in: an up service is ready at once
                in_flight.wait(self.poll_s)
            elif phase == "http" or now < next_attempt or dropped_at is not None:
                time.sleep(self.poll_s)

    # ---- attached by URL: liveness over HTTP ------------------------------------------------------

    def _wait_over_http(self) -> ReadyReport:
        """Readiness with no process state: death and silence read from HTTP (see the module docstring)."""
        report = ReadyReport()
        started = time.monotonic()
        self._report = report
        deadline = started + self.budget_s
        live = HttpLiveness(self.client)
        phase, problem = "http", "no HTTP answer yet (connection refused: not up yet)"
        in_flight: InFlight | None = None
        scheduler: InFlight | None = None  # /health_generate while a sampled request is overdue
        request = ""  # the request in flight (or the last one sent), as a person would write it
        dropped_at: float | None = None
        drops = 0
        next_attempt = started
        next_scheduler_check = 0.0
        free_at: float | None = None  # when /health_generate said 200 with the sampled request unanswered
        retried = _RetryAnswers(self.attached_retry_grace_s)  # 408 / 429 in a row: its answer, after a grace

        def beat() -> str:
            now = time.monotonic()
            extra = f"; {request} in flight for {format_seconds(in_flight.age)}" if in_flight else ""
            alive = (f"; it answered HTTP {format_seconds(now - live.answered_at)} ago"
                     if live.answered_at else "")
            return f"waiting {format_seconds(now - started)} in {phase} phase: {problem}{extra}{alive}"

        self._pace(beat, started)
        while True:
            interrupts.raise_if_lost()
            self._check_abandoned(phase, started)
            now = self._pass_at = time.monotonic()
            if now > deadline:
                raise ServiceNotReady(self.service.name, now - started,
                                      f"{phase} phase: {problem}{self._ready_said(phase)}")
            if live.answered_at is not None and (in_flight is not None or dropped_at is not None) and (
                    now >= live.next_probe):
                verdict = live.probe(every_s=self.poll_s if dropped_at is not None else LIVENESS_EVERY_S)
                if verdict == "refused":
                    seen = ("no HTTP response (connection dropped), then connections refused"
                            if dropped_at is not None else "connections refused while it was in flight")
                    raise self._gone(phase, request, seen, live)
                if live.silent_for() > self.request_timeout_s:
                    raise ServiceNotReady(self.service.name, now - started,
                                          f"{phase} phase: the server stopped answering HTTP: no answer to "
                                          f"GET {LIVENESS_PATH} for {format_seconds(live.silent_for())} "
                                          f"(request timeout {format_seconds(self.request_timeout_s)})")
            if dropped_at is not None:
                if now - dropped_at <= DEATH_GRACE_S:
                    time.sleep(self.poll_s)
                    continue
                dropped_at, drops = None, drops + 1  # still answering: the drop was not a death
                if drops >= 2:
                    raise ServiceNotReady(self.service.name, now - started,
                                          f"{phase} phase: {request} got no HTTP response twice, although "
                                          "the server kept answering HTTP")
            if phase == "http":
                if now >= next_attempt:
                    phase, problem = self._http_phase(live, report, started, problem, retried)
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
                                f"sampled phase: {request} not answered after "
                                f"{format_seconds(in_flight.age)} while {HEALTH_PATH} answers 200: the "
                                "scheduler is free, so this is not a JIT compiling: the request is stuck"
                                + self._ready_said(phase))
                        if free_at is None:
                            scheduler = None
                    if (scheduler is None and now >= next_scheduler_check and self.native
                            and not self.health_bypassed):  # bypassed: its 200 says nothing of the scheduler
                        scheduler = InFlight.status(self.client, HEALTH_PATH, LIVENESS_TIMEOUT_S + 1)
                        next_scheduler_check = now + SCHEDULER_CHECK_EVERY_S
                in_flight.wait(self.poll_s)
                continue
            finished, in_flight = in_flight, None
            if finished.error is None or finished.error.status not in RETRY_STATUSES:
                retried.reset()
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
            if error.status in RETRY_STATUSES and (stop := retried.seen(
                    now, f"{request} answered HTTP {error.status}: {answer_excerpt(error.body)}")):
                raise ServiceNotReady(self.service.name, now - started, f"{phase} phase: {stop}")
            next_attempt = now + 0.5

    def _http_phase(self, live: HttpLiveness, report: ReadyReport, started: float,
                    problem: str, retried: _RetryAnswers) -> tuple[str, str]:
        """One GET /v1/models: the next phase once the server answers 200 (a 4xx/5xx ends readiness, and so do
        408 / 429 kept up past ATTACHED_RETRY_GRACE_S)."""
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
            answered = (f"GET {LIVENESS_PATH} answered HTTP {response.status_code}: "
                        f"{answer_excerpt(response.text)}")
            if response.status_code in RETRY_STATUSES:
                if stop := retried.seen(now, answered):
                    raise ServiceNotReady(self.service.name, now - started, f"http phase: {stop}")
                return "http", f"{LIVENESS_PATH} answered HTTP {response.status_code}"
            # An OpenAI-compatible server answers /v1/models from its HTTP process, at once (SGLang:
            # 200 from the moment the port opens): a 4xx/5xx here will not go away by waiting.
            raise ServiceNotReady(self.service.name, now - started, f"http phase: {answered}")
        retried.reset()
        report.http_s = now - started
        if self.native is None:
            try:
                info = self.client.server_info(timeout_s=5)
            except ApiError:
                info = None
            self.native = info is not None
            self._version = str(info["version"]) if info and info.get("version") else None
        if self.native:
            return "warmup", f"{HEALTH_PATH} not answered yet"
        return "greedy", "greedy generation not answered yet"

    def _send(self, phase: str, remaining_s: float) -> tuple[InFlight, str]:
        """Start the phase's request in a thread; returns it and its description."""
        if phase == "warmup":
            return InFlight.status(self.client, HEALTH_PATH, HEALTH_TIMEOUT_S), f"GET {HEALTH_PATH}"
        sampling = GREEDY if phase == "greedy" else SAMPLED
        limit = max(1.0, min(remaining_s, self._limit(phase) + 1.0))  # the loop decides; the thread must end
        native = bool(self.native)
        request = describe_request(sampling, native=native)
        return InFlight.generation(self.client, sampling, native, limit), request

    def _limit(self, phase: str) -> float:
        """How long the phase's request may go unanswered while the server answers HTTP."""
        if phase == "sampled":
            return max(self.request_timeout_s, self.sampled_budget_s)  # the cold-JIT budget
        if phase == "warmup":
            return HEALTH_TIMEOUT_S + LIVENESS_TIMEOUT_S
        return self.request_timeout_s

    def _silent(self, phase: str, request: str, age: float, limit: float, started: float) -> ServiceNotReady:
        budget = (f"the first sampled request's cold-JIT budget, sampled_timeout {limit:g}s"
                  if phase == "sampled" and limit > self.request_timeout_s
                  else f"--request-timeout {limit:g}s")
        bypassed = (f"; {HEALTH_PATH} was not asked whether the scheduler is free: {self.health_bypassed}"
                    if phase == "sampled" and self.health_bypassed and self.native else "")
        return ServiceNotReady(self.service.name, time.monotonic() - started,
                               f"{phase} phase: {request} accepted and not answered for "
                               f"{format_seconds(age)} ({budget}); the server still answers HTTP{bypassed}"
                               f"{self._ready_said(phase)}")

    def _ready_said(self, phase: str) -> str:
        """'; GET /ready: 503 (...)' for a wait that stalls after the server answered HTTP (SGLang 0.5.20+:
        no generation; paused, shutting down or unhealthy), else ''."""
        if phase == "http" or self.native is False:
            return ""
        answer = ask_ready(self.client, self._version)
        return f"; {answer.describe()}" if answer is not None else ""

    def _refused_within(self, seconds: float, phase: str, request: str, answer: str,
                        live: HttpLiveness) -> None:
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

