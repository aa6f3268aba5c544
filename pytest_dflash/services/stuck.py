"""After readiness, a request that ran out of its total time (--request-timeout): does the engine still make
progress (`engine_progress`, from /health_generate, /metrics and a short streamed probe; on SGLang 0.5.20+
GET /ready says whether it was paused), and the failure that makes the service unusable for the rest of the
run (`ServiceStuck`, judged by `judge_lost_request`).

Where the service's environment sets SGLANG_DIAG_BYPASS_HEALTH_GENERATE (services/health.py), /health_generate
answers 200 without a generation: it is not asked, and the short streamed probe stands in for it (no token
within its bound = no output gets through)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pytest_dflash.client.deadline import DeadlineExceeded
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.errors import ApiError, ServiceNotReady
from pytest_dflash.services.health import ReadyAnswer, ask_ready
from pytest_dflash.services.liveness import HEALTH_PATH

# How long the progress check's /health_generate may take. SGLang answers it 200 as soon as ANY output leaves
# the scheduler after it was sent (a 1-token generation joins the running batch), so an engine that makes
# progress, however slowly, answers within one decode step; a wedged one only after
# SGLANG_HEALTH_CHECK_TIMEOUT (20 s), with 503. Capped by --request-timeout so the whole verdict stays about
# one request timeout.
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
    # the pace a short streamed probe decoded at (None: not measured, or fast)
    per_token_s: float | None = None
    fast: bool = False  # the streamed probe finished within its bound: fresh requests are served at speed
    ready: ReadyAnswer | None = None  # GET /ready (SGLang 0.5.20+), asked first

    @property
    def paused(self) -> bool:
        """No output, and the server says it takes no new requests (GET /ready 503): paused, shutting down or
        marked unhealthy, not silently stuck."""
        return self.moving is not True and self.ready is not None and self.ready.not_ready

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


@dataclass(frozen=True)
class Pace:
    """A short greedy stream read for at most its bound."""

    per_token_s: float | None  # seconds per token (None: not measured, or the stream finished in time)
    said: str
    fast: bool  # it finished within its bound
    output: bool | None  # whether any token came (None: the request failed: nothing learnt)


def _pace(client: InferenceClient, *, native: bool, seconds: float) -> Pace:
    """A short greedy stream read for at most `seconds`: its pace, what it showed, whether it finished."""
    sampling = Sampling(max_tokens=32, temperature=0.0, ignore_eos=True)
    try:
        stream = (client.generate_stream("Hello", sampling, timeout_s=seconds) if native
                  else client.completion_stream("Hello", sampling, timeout_s=seconds))
    except DeadlineExceeded as exc:
        if exc.per_token_s is None:
            return Pace(None, f"a {seconds:g}s streamed probe got {exc.got}", False, bool(exc.tokens))
        return Pace(exc.per_token_s, f"a streamed probe: {exc.tokens} tokens in {seconds:g}s, "
                                     f"{exc.per_token_s:.2f} s per token", False, True)
    except ApiError as exc:
        return Pace(None, f"a streamed probe failed: {exc.message}", False, None)
    return Pace(None, f"a streamed probe of 32 tokens finished in {stream.elapsed_s:.1f}s", True, True)


def engine_progress(client: InferenceClient, *, native: bool, request_timeout_s: float,
                    measure_pace: bool = False, health_bypassed: str | None = None,
                    version: str | None = None) -> EngineProgress:
    """Ask a server whose request ran out of time whether its engine still makes progress.

    GET /ready first (native SGLang 0.5.20+, or a version not known; no generation): 503 = it takes no new
    requests (paused, shutting down, marked unhealthy; on 0.5.23+ GET /ping tells a pause). Asked before
    /health_generate, whose own failure would mark the server unhealthy.
    /health_generate (native SGLang): 200 = a 1-token generation got through the scheduler (progress); 503 or
    no answer within PROGRESS_HEALTH_S = it did not. Not asked when `health_bypassed` (why:
    SGLANG_DIAG_BYPASS_HEALTH_GENERATE is set, so its 200 says nothing).
    /metrics (when the server exposes it), read before and after: generation / request counters that moved =
    progress; nothing moved while requests are running = none.
    A short streamed greedy probe: with `measure_pace`, how fast output still gets through (for a request that
    was not streamed, so its own pace is unknown); in place of /health_generate when that is bypassed: any
    token = progress, none within its bound = none.
    Bounded: at most 2 x 2 s (/ready, /ping) + 2 x PROGRESS_HEALTH_S (each capped at the request timeout) +
    2 x 2 s.
    """
    probe_s = min(PROGRESS_HEALTH_S, max(1.0, request_timeout_s))
    started = time.monotonic()
    ready = ask_ready(client, version) if native else None
    before = _metrics(client, 2.0)
    evidence: list[str] = [ready.describe()] if ready is not None else []
    health: bool | None = None
    if native and health_bypassed:
        evidence.append(f"{HEALTH_PATH} not asked: {health_bypassed}, so its 200 would not mean output got "
                        "through")
    elif native:
        try:
            status = client.health_generate(timeout_s=probe_s)
        except ApiError as exc:
            if exc.cause == "timeout":
                health = False
                evidence.append(f"{HEALTH_PATH}: no answer within {probe_s:g}s (a 1-token generation did not "
                                "get through the scheduler)")
            else:
                evidence.append(f"{HEALTH_PATH}: {exc.message}")
        else:
            health = status == 200
            evidence.append(f"{HEALTH_PATH} answered {status}"
                            + (" (a 1-token generation got through)" if health
                               else " (no output from the scheduler)"))
    metrics: bool | None = None
    if before is not None:
        if time.monotonic() - started < 1.0:
            time.sleep(1.0)  # counters need a moment to move
        after = _metrics(client, 2.0) or {}
        span = time.monotonic() - started
        moved = {name: after.get(name, 0.0) - before.get(name, 0.0)
                 for name in PROGRESS_COUNTERS if name in after}
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
    stands_in = native and bool(health_bypassed)  # the probe is the evidence /health_generate cannot give
    if (measure_pace or stands_in) and moving is not False:
        pace = _pace(client, native=native, seconds=probe_s)
        per_token, fast = pace.per_token_s, pace.fast
        evidence.append(pace.said + (" (in place of /health_generate)" if stands_in else ""))
        if stands_in and moving is None and pace.output is not None:
            moving = pace.output
    return EngineProgress(moving, evidence, per_token, fast, ready)


@dataclass(eq=False)
class ServiceStuck(ServiceNotReady):
    """After readiness, a request ran out of --request-timeout: the service is unusable for the rest of the
    run (stuck, or far too slow), like a death; its remaining tests are blocked naming this."""

    request: str = ""
    got: str = ""
    progress: str = ""
    moving: bool | None = None  # EngineProgress.moving
    per_token_s: float | None = None  # the pace seen (the request's own stream, else the probe's)
    # GET /ready answered 503 and no output got through (EngineProgress.paused): what the server is instead of
    # stuck: "paused" (0.5.23+: /ping 200), else "paused or unhealthy"
    not_ready: str = ""

    @property
    def kind(self) -> str:
        """"paused" / "paused or unhealthy" (GET /ready 503, no output), "stuck" (no output gets through),
        "far too slow" (a pace was measured), else "not answering in time"."""
        if self.not_ready:
            return self.not_ready
        if self.moving is False:
            return "stuck"
        if self.per_token_s is not None and self.per_token_s > 0:
            return "far too slow"
        return "not answering in time"

    @property
    def what(self) -> str:
        """"stuck", "far too slow (0.50 s per token)", "paused (GET /ready 503)", "not answering in time"."""
        if self.not_ready:
            return f"{self.kind} (GET /ready 503)"
        return (f"{self.kind} ({self.per_token_s:.2f} s per token)" if self.kind == "far too slow"
                else self.kind)

    def __str__(self) -> str:
        return (f"service {self.service} is {self.what}: {self.request} not answered within "
                f"{format_seconds(self.waited_s)} (--request-timeout, total time): got {self.got}; "
                f"{self.progress}")


def judge_lost_request(client: InferenceClient, error: DeadlineExceeded, *, label: str, native: bool,
                       request_timeout_s: float, health_bypassed: str | None = None,
                       version: str | None = None) -> tuple[ServiceStuck | None, str]:
    """A ready service's request ran out of its total time: ask its engine whether it still makes progress.
    Returns the service's failure (None: fresh requests are served at speed, this request alone was lost) and
    what was found, in words. `health_bypassed`, `version`: as engine_progress takes them."""
    progress = engine_progress(client, native=native, request_timeout_s=request_timeout_s,
                               measure_pace=error.per_token_s is None, health_bypassed=health_bypassed,
                               version=version)
    if progress.fast:
        # Fresh requests are served at speed: this request alone was lost (its test fails with it), the
        # service is neither stuck nor too slow, and its other tests are not held up by it.
        return None, (f"{progress.describe()}: this request alone was lost; the service is not blocked (a "
                      "fresh request is answered at speed)")
    method = error.method or "POST"
    stuck = ServiceStuck(label, error.limit_s, f"{method} {error.endpoint} timed out",
                         request=f"{method} {error.endpoint}", got=error.got, progress=progress.describe(),
                         moving=progress.moving, per_token_s=error.per_token_s or progress.per_token_s,
                         not_ready=_not_ready(progress))
    return stuck, progress.describe()


def _not_ready(progress: EngineProgress) -> str:
    if not progress.paused or progress.ready is None:
        return ""
    # 0.5.23+ tells a pause from ill health (/ping); otherwise a pause, a shutdown and a failed health check
    # (which a paused engine fails too) all read 503
    return "paused" if progress.ready.paused else "paused or unhealthy"
