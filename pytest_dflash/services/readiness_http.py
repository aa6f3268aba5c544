"""Readiness of a server attached by URL, with no process state to ask: its liveness read over HTTP (see
services/readiness.py's docstring). "Not up yet" is connection refused before it ever answered, or
`/health_generate` 503 during warm-up; "gone" is a request dropped and/or connections refused after it had
answered (`ServiceGone`, naming the request)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pytest_dflash import interrupts
from pytest_dflash.client.sampling import GREEDY, SAMPLED
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.errors import ApiError, Death, ServiceGone, ServiceNotReady
from pytest_dflash.services.liveness import (
    HEALTH_PATH,
    LIVENESS_EVERY_S,
    LIVENESS_PATH,
    LIVENESS_TIMEOUT_S,
    HttpLiveness,
    InFlight,
)
from pytest_dflash.services.readiness_base import (
    DEATH_GRACE_S,
    FREE_GRACE_S,
    HEALTH_TIMEOUT_S,
    LAST_WORDS_S,
    PHASES,
    RETRY_STATUSES,
    SAMPLED_PENDING,
    SCHEDULER_CHECK_EVERY_S,
    RetryAnswers,
    WatcherBase,
    answer_excerpt,
    describe_request,
    generation_answered,
)
from pytest_dflash.services.startup import ReadyReport, finish_phases


@dataclass
class HttpWait(WatcherBase):
    """The wait over HTTP alone (`ReadinessWatcher` picks it for a service whose state has no process)."""

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
        retried = RetryAnswers(self.attached_retry_grace_s)  # 408 / 429 in a row: its answer, after a grace

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
                if generation_answered(report, phase, finished.age, now - started):
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
                    problem: str, retried: RetryAnswers) -> tuple[str, str]:
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
