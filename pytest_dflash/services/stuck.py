"""After readiness, a request that ran out of its total time (--request-timeout): does the engine still make
progress (`engine_progress`, from /health_generate, /metrics and a short streamed probe), and the failure that
makes the service unusable for the rest of the run (`ServiceStuck`, judged by `judge_lost_request`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pytest_dflash.client.deadline import DeadlineExceeded
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.errors import ApiError, ServiceNotReady
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
    """Seconds per token of a short greedy stream read for at most `seconds` (None: not measured, or the
    stream finished in time: fast); what it showed; and whether it finished in time."""
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
    no answer within PROGRESS_HEALTH_S = it did not. /metrics (when the server exposes it), read before and
    after: generation / request counters that moved = progress; nothing moved while requests are running =
    none. `measure_pace`: when output still gets through, a short streamed greedy probe measures how fast (for
    a request that was not streamed, so its own pace is unknown). Bounded: at most 2 x PROGRESS_HEALTH_S (each
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
    if measure_pace and moving is not False:
        per_token, said, fast = _pace(client, native=native, seconds=probe_s)
        evidence.append(said)
    return EngineProgress(moving, evidence, per_token, fast)


@dataclass(eq=False)
class ServiceStuck(ServiceNotReady):
    """After readiness, a request ran out of --request-timeout: the service is unusable for the rest of the
    run (stuck, or far too slow), like a death; its remaining tests are blocked naming this."""

    request: str = ""
    got: str = ""
    progress: str = ""
    moving: bool | None = None  # EngineProgress.moving
    per_token_s: float | None = None  # the pace seen (the request's own stream, else the probe's)

    @property
    def kind(self) -> str:
        """"stuck" (no output gets through), "far too slow" (a pace was measured), else "not answering in
        time"."""
        if self.moving is False:
            return "stuck"
        if self.per_token_s is not None and self.per_token_s > 0:
            return "far too slow"
        return "not answering in time"

    @property
    def what(self) -> str:
        """"stuck", "far too slow (0.50 s per token)", "not answering in time"."""
        return (f"{self.kind} ({self.per_token_s:.2f} s per token)" if self.kind == "far too slow"
                else self.kind)

    def __str__(self) -> str:
        return (f"service {self.service} is {self.what}: {self.request} not answered within "
                f"{format_seconds(self.waited_s)} (--request-timeout, total time): got {self.got}; "
                f"{self.progress}")


def judge_lost_request(client: InferenceClient, error: DeadlineExceeded, *, label: str, native: bool,
                       request_timeout_s: float) -> tuple[ServiceStuck | None, str]:
    """A ready service's request ran out of its total time: ask its engine whether it still makes progress.
    Returns the service's failure (None: fresh requests are served at speed, this request alone was lost) and
    what was found, in words."""
    progress = engine_progress(client, native=native, request_timeout_s=request_timeout_s,
                               measure_pace=error.per_token_s is None)
    if progress.fast:
        # Fresh requests are served at speed: this request alone was lost (its test fails with it), the
        # service is neither stuck nor too slow, and its other tests are not held up by it.
        return None, (f"{progress.describe()}: this request alone was lost; the service is not blocked (a "
                      "fresh request is answered at speed)")
    method = error.method or "POST"
    stuck = ServiceStuck(label, error.limit_s, f"{method} {error.endpoint} timed out",
                         request=f"{method} {error.endpoint}", got=error.got, progress=progress.describe(),
                         moving=progress.moving, per_token_s=error.per_token_s or progress.per_token_s)
    return stuck, progress.describe()
