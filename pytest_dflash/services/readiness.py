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

A tensor-parallel service's rank processes are read meanwhile (services/ranks.py `RankWatch`): a rank stopped
(SIGSTOP, a debugger, a driver call that does not return) ends the wait at once, naming the rank, its pid and
its GPU, where HTTP alone would show what a cold JIT shows (a request accepted, not answered).

This module holds the wait over a process (`ReadinessWatcher`); the wait over HTTP alone is in
services/readiness_http.py, the budgets, phases, heartbeat clock (`Pacemaker`) and shared state in
services/readiness_base.py; its probes are in services/liveness.py, what it reports and the start-up log it
reads meanwhile in services/startup.py.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from pytest_dflash import interrupts
from pytest_dflash.client.sampling import GREEDY, SAMPLED
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.errors import (
    ApiError,
    DflashError,
    RankFault,
    ServiceCrashed,
    ServiceNotReady,
    ServiceRestarted,
)
from pytest_dflash.services.base import ServiceState
from pytest_dflash.services.liveness import InFlight
from pytest_dflash.services.phases import nccl_init_stuck
from pytest_dflash.services.ranks import rank_faults_in_log, rank_gpu, rank_on_gpu
from pytest_dflash.services.readiness_base import (
    DEATH_GRACE_S,
    LAST_WORDS_S,
    PHASES,
    RETRY_STATUSES,
    SAMPLED_PENDING,
    Pacemaker,
    answer_excerpt,
    describe_request,
    generation_answered,
)
from pytest_dflash.services.readiness_http import HttpWait
from pytest_dflash.services.startup import ReadyReport, StartupWatch, finish_phases

__all__ = ["LAST_WORDS_S", "ReadinessWatcher", "answer_excerpt", "describe_request"]


@dataclass
class ReadinessWatcher(HttpWait):
    """Waits for one service to be ready, failing fast when it dies, restarts or a rank of it stops."""

    def _check_alive(self, phase: str) -> ServiceState:
        state = self.service.state()
        if self._base_restarts is None:
            self._base_restarts = state.restarts
        if state.death is not None:
            # journald may need a moment to receive the last lines of a dying process.
            time.sleep(0.2)
            log = self.service.logs_since(self.log_mark, self.log_lines)
            when = "start-up" if phase == "http" else "readiness"
            raise ServiceCrashed(self.service.name, state.death, log, PHASES.get(phase, phase),
                                 ranks=tuple(rank_faults_in_log(log, self.gpus, when=when)))
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
        past = [r.label for r in startup.log.ranks.values() if r.nccl_ended is not None]
        before = [r.label for r in startup.log.ranks.values() if r.nccl_begun is None]
        raise ServiceNotReady(
            self.service.name, time.monotonic() - started,
            f"start-up: {', '.join(rank_on_gpu(r.label, self.gpus) for r in stuck)} stuck in NCCL init "
            f"(Init torch distributed begin, no 'ends') for {format_seconds(longest)}, past "
            f"nccl_init_timeout {format_seconds(self.nccl_init_budget_s)} of a tensor-parallel start-up"
            + (f"; {', '.join(past)} got past it" if past else "; no rank got past it")
            + (f"; {', '.join(before)} never reached it" if before else ""),
            self.service.logs_since(self.log_mark, self.log_lines),
            ranks=tuple(RankFault(r.tp_rank, "hangs", "in NCCL init (Init torch distributed begin, no "
                                  "'ends')", gpu=rank_gpu(r.tp_rank, self.gpus), when="start-up")
                        for r in stuck if r.tp_rank is not None))

    def _check_ranks(self, phase: str, now: float, started: float, in_flight: InFlight | None) -> None:
        """A tensor-parallel rank stopped at two reads in a row ends the wait at once, naming it: every
        collective waits for it, so no request is answered while it is stopped (HTTP alone shows what a cold
        JIT shows)."""
        if self.rank_watch is None:
            return
        stopped = self.rank_watch.stopped(now, when="start-up" if phase == "http" else "readiness")
        if not stopped:
            return
        waiting = (f" ({PHASES.get(phase, phase).removeprefix('readiness: ')} in flight for "
                   f"{format_seconds(in_flight.age)})" if in_flight is not None else "")
        raise ServiceNotReady(
            self.service.name, now - started,
            f"{phase} phase: {'; '.join(f.sentence() for f in stopped)}{waiting}: every collective of the "
            "tensor-parallel engine waits for it, so no request can be answered",
            self.service.logs_since(self.log_mark, self.log_lines), ranks=tuple(stopped))

    def wait(self) -> ReadyReport:
        self._beat, self._pass_at = None, time.monotonic()
        self._pacemaker = Pacemaker(self._heartbeat, self.progress_every_s) if self.progress else None
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
            self._check_ranks(phase, now, started, in_flight)
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
                        if generation_answered(report, phase, finished.age, now - started):
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
