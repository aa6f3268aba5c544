"""What a readiness wait is made of (services/readiness.py waits): its budgets and phases, the requests it
sends in words, the heartbeat's own clock (`Pacemaker`: every 10 s the loop's current state, also while the
loop is inside one call), and the state and small steps every wait shares (`WatcherBase`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.errors import ServiceNotReady
from pytest_dflash.scrub.bounds import scrub
from pytest_dflash.services.base import LogMark, ServiceManager
from pytest_dflash.services.events import Heartbeat, Progress
from pytest_dflash.services.health import ask_ready
from pytest_dflash.services.ranks import RankWatch
from pytest_dflash.services.startup import ReadyReport, StartupWatch

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
class RetryAnswers:
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


def generation_answered(report: ReadyReport, phase: str, request_s: float, elapsed_s: float) -> bool:
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



class Pacemaker:
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

    def __enter__(self) -> Pacemaker:
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


def describe_request(sampling: Sampling, *, native: bool) -> str:
    """'POST /generate (max_new_tokens 8, temperature 0.8, top_k 20, top_p 0.9)': the request a readiness
    probe sends, to name the one that killed a server."""
    if native:
        params = sampling.as_sglang()
        return "POST /generate (" + ", ".join(f"{k} {v}" for k, v in params.items()) + ")"
    params = sampling.as_openai()
    return "POST /v1/completions (" + ", ".join(f"{k} {v}" for k, v in params.items()) + ")"


@dataclass
class WatcherBase:
    """What every readiness wait keeps: the service, its client and budgets, the heartbeat, what it saw."""

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
    # a tensor-parallel service on a host this run reads: its rank processes, read while a generation is in
    # flight, so a stopped rank ends the wait naming it (services/ranks.py)
    rank_watch: RankWatch | None = None
    _base_restarts: int | None = None
    _version: str | None = None  # /server_info version, once read
    # the running wait's heartbeat text and its pacemaker, and when its loop began its current pass
    _beat: Callable[[], str] | None = None
    _pacemaker: Pacemaker | None = None
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

    def _ready_said(self, phase: str) -> str:
        """'; GET /ready: 503 (...)' for a wait that stalls after the server answered HTTP (SGLang 0.5.20+:
        no generation; paused, shutting down or unhealthy), else ''."""
        if phase == "http" or self.native is False:
            return ""
        answer = ask_ready(self.client, self._version)
        return f"; {answer.describe()}" if answer is not None else ""
