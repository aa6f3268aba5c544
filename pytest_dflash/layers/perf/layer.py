"""The perf layer: one load run per service, judged against the host's floors, its baseline and its peers.

    settings = PerfSettings.resolve(profile.perf, "dflash", overrides)
    run = ServiceRun.measure(host="ct200", service="dflash", algorithm="DFLASH", url=..., settings=settings,
                             native=True)
    for judgement in judge_floors(run, profile.floors["dflash"]):
        print(judgement.outcome, judgement.message)

Every judgement is made on a confidence bound over requests (`pytest_dflash.layers.perf.stats`), never on a point
estimate, and has one of four outcomes:

* ``pass`` — the bound on the good side clears the threshold;
* ``fail`` — the bound on the bad side is past it (the message has the measured value, the bound, the
  confidence level and the threshold);
* ``inconclusive`` — the run was too short or too noisy to decide; the message says about how many more
  requests would decide. Never a silent pass: the perf suite fails the test (see docs/perf.md, *Outcomes*);
* ``refused`` — the load client itself was saturated (event-loop lag, CPU): its numbers measure the client,
  not the server, so no timing floor is judged on them (the run is measured again ``retries`` times first).
  Accept length is the exception: the server counts it per request (tokens / verify steps), so a slow client
  does not change it and it is judged either way.

Nothing here imports pytest: the suite and ``perf_hooks`` turn these outcomes into test outcomes. (Over 600
lines on purpose: settings, judgements, comparisons, the ServiceRun record and baselines share the judging
helpers; the per-token ceiling, which does not, lives in token_latency.py.)
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_dflash.config.tables.floors import LATENCY_FLOOR
from pytest_dflash.layers.perf.stats import (
    Sample,
    Verdict,
    judge_floor,
    judge_ratio,
    judge_regression,
    metric_sample,
    ratio_bound,
)
from pytest_dflash.load.results import LoadResult
from pytest_dflash.load.run import run_load
from pytest_dflash.load.spec import LoadSpec
from pytest_dflash.load.workload import Workload

__all__ = [
    "Comparison",
    "Judgement",
    "PerfOverrides",
    "PerfSettings",
    "ServiceRun",
    "baseline_path",
    "comparison_pairs",
    "judge_accept_length",
    "judge_baseline",
    "judge_floors",
    "judge_speedup",
    "load_baseline",
    "save_baseline",
]

Outcome = Literal["pass", "fail", "inconclusive", "refused"]
NOT_PASSING: tuple[Outcome, ...] = ("fail", "inconclusive", "refused")
DEFAULT_CONFIDENCE = 0.95
DEFAULT_REGRESSION_PCT = 10.0
DEFAULT_REQUESTS = 200
# Statistics compared with a saved baseline (latency percentiles of a short run are too wide to gate on a ratio).
BASELINE_METRICS = ("output_tok_s", "accept_length")
# A baseline is comparable only when it was measured with the same load.
COMPARABLE_FIELDS = ("endpoint", "concurrency", "request_rate", "prompt_len", "output_len", "dataset",
                     "temperature", "top_p", "top_k", "ignore_eos")
UNITS = {"output_tok_s": "tok/s", "accept_length": "tokens/step"}


# ------------------------------------------------------------------------------------------------
# Settings: the profile's [perf] table, [perf.SERVICE] and the command line
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PerfOverrides:
    """Command-line overrides (``--perf-requests`` …); None = keep the profile's value."""

    requests: int | None = None
    duration_s: float | None = None
    concurrency: int | None = None
    warmup: int | None = None
    client_procs: int | None = None
    dataset: str | None = None  # --perf-dataset: an absolute path (or "builtin"), already checked


@dataclass(frozen=True, kw_only=True)
class PerfSettings:
    """How one service is loaded. Defaults suit a GPU host; ``hosts/local.toml`` sets its own."""

    endpoint: str = "auto"  # auto: SGLang's native /generate when the server speaks it, else chat
    concurrency: int = 8
    requests: int | None = DEFAULT_REQUESTS
    duration_s: float | None = None
    warmup: int | None = None  # None: one request per concurrency slot
    prompt_len: int = 256
    output_len: int = 128
    temperature: float = 0.0
    seed: int = 0
    request_timeout_s: float = 120.0
    max_loop_lag_ms: float = 5.0
    max_client_cpu: float = 0.9
    retries: int = 1  # runs measured again when the client was saturated
    client_procs: int = 1  # load client processes the run is spread over (one event loop each)
    dataset: str | None = None  # prompts instead of synthetic words (JSONL / ShareGPT / "builtin"); None: synthetic

    @classmethod
    def resolve(cls, perf: Mapping[str, Any], service: str,
                overrides: PerfOverrides | None = None) -> PerfSettings:
        """[perf], then [perf.SERVICE], then the command line.

        ``requests`` and ``duration`` go together: a layer that sets either replaces both (a run with
        both stops at whichever comes first; one without either runs 200 requests).
        """
        kw: dict[str, Any] = {}
        names = {"endpoint": "endpoint", "concurrency": "concurrency", "warmup": "warmup",
                 "prompt_len": "prompt_len", "output_len": "output_len", "temperature": "temperature",
                 "seed": "seed", "request_timeout": "request_timeout_s", "max_loop_lag_ms": "max_loop_lag_ms",
                 "max_client_cpu": "max_client_cpu", "retries": "retries", "client_procs": "client_procs",
                 "dataset": "dataset"}
        for key, attr in names.items():
            if key in perf:
                kw[attr] = perf[key]
        length: tuple[int | None, float | None] = (DEFAULT_REQUESTS, None)
        layers: list[Mapping[str, Any]] = [perf, dict(perf.get("services", {})).get(service, {})]
        for layer in layers:
            if "requests" in layer or "duration" in layer:
                length = (layer.get("requests"), layer.get("duration"))
            if layer is not perf and "warmup" in layer:
                kw["warmup"] = layer["warmup"]
        if overrides is not None:
            if overrides.requests is not None or overrides.duration_s is not None:
                length = (overrides.requests, overrides.duration_s)
            if overrides.concurrency is not None:
                kw["concurrency"] = overrides.concurrency
            if overrides.warmup is not None:
                kw["warmup"] = overrides.warmup
            if overrides.client_procs is not None:
                kw["client_procs"] = overrides.client_procs
            if overrides.dataset is not None:
                kw["dataset"] = overrides.dataset
        kw["requests"], kw["duration_s"] = length
        return cls(**kw)

    def endpoint_for(self, native: bool) -> str:
        if self.endpoint == "auto":
            return "generate" if native else "chat"
        return self.endpoint

    def load_spec(self, *, native: bool, speculative: bool, model: str = "default", may_flush: bool = True) -> LoadSpec:
        """The load generator's spec. Server-side accept length (/flush_cache, /server_info): native + speculative,
        and only where the run may flush the server's cache (`may_flush`: not on an attached server without opt-in)."""
        return LoadSpec(
            endpoint=self.endpoint_for(native),  # type: ignore[arg-type]
            model=model,
            concurrency=self.concurrency,
            num_requests=self.requests,
            duration_s=self.duration_s,
            warmup_requests=self.concurrency if self.warmup is None else self.warmup,
            prompt_len=self.prompt_len,
            output_len=self.output_len,
            dataset=self.dataset,
            temperature=self.temperature,
            seed=self.seed,
            request_timeout_s=self.request_timeout_s,
            server_accept_length=native and speculative and may_flush,
            max_loop_lag_ms=self.max_loop_lag_ms,
            max_client_cpu=self.max_client_cpu,
            client_procs=self.client_procs,
        )

    def describe(self, native: bool) -> str:
        size = " and ".join(part for part in (
            f"{self.requests} requests" if self.requests is not None else "",
            f"{self.duration_s:g} s" if self.duration_s is not None else "") if part)
        procs = f", {self.client_procs} client processes" if self.client_procs > 1 else ""
        prompts = (f"prompts of {Path(self.dataset).name} + {self.output_len} tokens" if self.dataset
                   else f"{self.prompt_len}+{self.output_len} tokens")
        return f"{self.endpoint_for(native)}, concurrency {self.concurrency}, {prompts}, {size}{procs}"


# ------------------------------------------------------------------------------------------------
# Judgements
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """One floor (or baseline, or speed-up) judged, with its evidence in ``message``."""

    key: str  # machine name: output_tok_s, itl_p99_ms, accept_length, speedup_vs_none, baseline.output_tok_s, errors
    outcome: Outcome
    message: str
    point: float | None = None
    bound: float | None = None
    lower: float | None = None
    upper: float | None = None
    threshold: float | None = None
    confidence: float | None = None
    n: int | None = None
    more_requests: int | None = None

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @classmethod
    def of(cls, key: str, verdict: Verdict, *, message: str | None = None) -> Judgement:
        return cls(key=key, outcome=verdict.outcome, message=message or verdict.message, point=verdict.point,
                   bound=verdict.bound, lower=verdict.lower, upper=verdict.upper, threshold=verdict.threshold,
                   confidence=verdict.confidence, n=verdict.n, more_requests=verdict.more_requests)

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def _refused(key: str, run: ServiceRun, threshold: float | None = None, why: str | None = None) -> Judgement:
    reason = why or run.refusal or ""
    return Judgement(key=key, outcome="refused", threshold=threshold,
                     message=f"{key}: REFUSED — no judgement: {reason}")


def _judge_metric(run: ServiceRun, key: str, threshold: float, *, higher_is_better: bool,
                  confidence: float) -> Judgement:
    if run.refusal:
        return _refused(key, run, threshold)
    try:
        sample = metric_sample(run.result, key)
    except ValueError as exc:
        return Judgement(key=key, outcome="inconclusive", threshold=threshold,
                         message=f"{key}: INCONCLUSIVE — cannot be measured on this run: {exc}")
    return Judgement.of(key, judge_floor(key, sample, threshold, higher_is_better=higher_is_better,
                                         confidence=confidence))


def confidence_of(floors: Mapping[str, float | str]) -> float:
    value = floors.get("confidence", DEFAULT_CONFIDENCE)
    return float(value) if isinstance(value, int | float) else DEFAULT_CONFIDENCE


def judge_errors(run: ServiceRun) -> Judgement:
    """A perf run in which requests failed is a failure whatever its numbers (errors are not slowness)."""
    metrics = run.result.metrics
    completed, failed = int(metrics["completed"]), int(metrics["failed"])
    if not failed:
        return Judgement(key="errors", outcome="pass", point=0.0,
                         message=f"errors: pass — all {completed} measured requests completed")
    kinds = ", ".join(f"{k}={v}" for k, v in sorted(run.result.errors_by_kind.items()))
    first = next((r.error for r in run.result.measured if r.error is not None), None)
    return Judgement(key="errors", outcome="fail", point=float(failed),
                     message=f"errors: FAIL — {failed} of {completed + failed} requests failed ({kinds}); "
                             f"first: {first}")


def judge_floors(run: ServiceRun, floors: Mapping[str, float | str]) -> list[Judgement]:
    """Errors, then ``output_tok_s`` (a floor) and every latency ceiling (``ttft_p99_ms`` …) of the service."""
    confidence = confidence_of(floors)
    out = [judge_errors(run)]
    for key, value in floors.items():
        if key == "output_tok_s" and isinstance(value, int | float):
            out.append(_judge_metric(run, key, float(value), higher_is_better=True, confidence=confidence))
        elif LATENCY_FLOOR.match(key) and isinstance(value, int | float):
            out.append(_judge_metric(run, key, float(value), higher_is_better=False, confidence=confidence))
    return out


def judge_accept_length(run: ServiceRun, floors: Mapping[str, float | str]) -> Judgement:
    """Per-request accept length (``meta_info`` of native /generate), token-weighted, against the floor.

    Without an ``accept_length`` floor the check is that at least one token is emitted per verify step.
    The server-side value (``/server_info`` after ``/flush_cache``) is reported next to it.
    """
    key = "accept_length"
    raw = floors.get(key)
    threshold = float(raw) if isinstance(raw, int | float) else 1.0
    server = run.result.server_accept_length
    server_text = (f"server-side /server_info after /flush_cache: {server:.3f}" if server is not None
                   else f"no server-side value ({run.server_accept_skipped})" if run.server_accept_skipped
                   else "no server-side value (/server_info needs SGLang's native API)")
    # No refusal on a saturated client: the server counts tokens and verify steps, the client's timing
    # does not enter the ratio.
    if run.refusal:
        server_text += "; the load client was saturated, which slows its timings, not the server's counts"
    try:
        sample = metric_sample(run.result, key)
    except ValueError as exc:
        return Judgement(key=key, outcome="inconclusive", threshold=threshold,
                         message=f"{key}: INCONCLUSIVE — no per-request accept length ({exc}); {server_text}")
    verdict = judge_floor(key if raw is not None else f"{key} (no floor set: at least 1 token per verify step)",
                          sample, threshold, confidence=confidence_of(floors))
    return Judgement.of(key, verdict, message=f"{verdict.message}; {server_text}")


def _same_load(a: LoadSpec, b: LoadSpec) -> list[str]:
    """Fields of the load shape that differ between two runs: 'concurrency 8 -> 1'."""
    da, db = a.to_dict(), b.to_dict()
    return [f"{name} {db.get(name)!r} -> {da.get(name)!r}" for name in COMPARABLE_FIELDS
            if da.get(name) != db.get(name)]


def judge_speedup(run: ServiceRun, other: ServiceRun, floor: float, *, confidence: float) -> Judgement:
    """output tok/s of ``run`` over ``other``'s (both resampled) against a floor: the same load, one host."""
    key = f"speedup_vs_{other.service}"
    if run.refusal or other.refusal:
        return _refused(key, run if run.refusal else other, floor)
    diff = _same_load(run.result.spec, other.result.spec)
    if diff:
        return _refused(key, run, floor, why=f"{run.service} and {other.service} were not loaded the same way "
                                              f"({', '.join(diff)})")
    try:
        a, b = metric_sample(run.result, "output_tok_s"), metric_sample(other.result, "output_tok_s")
    except ValueError as exc:
        return Judgement(key=key, outcome="inconclusive", threshold=floor,
                         message=f"{key}: INCONCLUSIVE — cannot be measured: {exc}")
    name = f"speed-up {run.service} ({run.algorithm}) / {other.service} ({other.algorithm})"
    verdict = judge_ratio(name, a, b, floor, confidence=confidence)
    accept = _accept_pair(run, other)
    return Judgement.of(key, verdict, message=verdict.message + accept)


def _accept_pair(run: ServiceRun, other: ServiceRun) -> str:
    a, b = run.accept_length, other.accept_length
    if a is None:
        return ""
    return f"; accept length {a:.3f}" + (f" vs {b:.3f}" if b is not None else f" ({other.algorithm}: 1 by definition)")


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"


# ------------------------------------------------------------------------------------------------
# Comparisons between services of one host (DDTREE vs DFLASH vs NONE)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Output tok/s of ``service`` over ``versus`` at the same load, with bounds at ``confidence`` each."""

    service: str
    versus: str
    algorithm: str
    versus_algorithm: str
    point: float
    lower: float
    upper: float
    confidence: float
    concurrency: int | None
    accept_length: float | None
    versus_accept_length: float | None

    def describe(self) -> str:
        """'ddtree/dflash 0.99x [0.93, 1.06] (accept length 5.00 vs 4.92)'."""
        accept = ""
        if self.accept_length is not None and self.versus_accept_length is not None:
            accept = f" (accept length {self.accept_length:.2f} vs {self.versus_accept_length:.2f})"
        elif self.accept_length is not None:
            accept = f" (accept length {self.accept_length:.2f})"
        return f"{self.service}/{self.versus} {self.point:.2f}x [{self.lower:.2f}, {self.upper:.2f}]{accept}"


def comparison_pairs(algorithms: Mapping[str, str]) -> list[tuple[str, str]]:
    """(faster, slower) service pairs worth a speed-up: each speculative one vs NONE, DDTREE vs DFLASH."""
    pairs = []
    for a, alg_a in algorithms.items():
        for b, alg_b in algorithms.items():
            if a != b and ((alg_b == "NONE" and alg_a != "NONE") or (alg_a == "DDTREE" and alg_b == "DFLASH")):
                pairs.append((a, b))
    return pairs


def compare(run: ServiceRun, other: ServiceRun, *, confidence: float = DEFAULT_CONFIDENCE) -> Comparison | None:
    """The speed-up of ``run`` over ``other``, or None when it cannot be stated (different load, no data)."""
    if _same_load(run.result.spec, other.result.spec) or run.refusal or other.refusal:
        return None
    try:
        bound = ratio_bound(metric_sample(run.result, "output_tok_s"), metric_sample(other.result, "output_tok_s"),
                            confidence=confidence)
    except ValueError:
        return None
    return Comparison(service=run.service, versus=other.service, algorithm=run.algorithm,
                      versus_algorithm=other.algorithm, point=bound.point, lower=bound.lower, upper=bound.upper,
                      confidence=confidence, concurrency=run.result.spec.concurrency,
                      accept_length=run.accept_length, versus_accept_length=other.accept_length)


# ------------------------------------------------------------------------------------------------
# One service's run
# ------------------------------------------------------------------------------------------------

Runner = Callable[..., LoadResult]


@dataclass
class ServiceRun:
    """One service's load run and everything judged on it."""

    host: str
    service: str
    algorithm: str
    settings: PerfSettings
    result: LoadResult
    native: bool = True
    attempts: int = 1
    saturated_attempts: int = 0
    judgements: dict[str, Judgement] = field(default_factory=dict)
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None
    wall_s: float = 0.0
    server_accept_skipped: str | None = None  # why the server-side accept length was not read (no flush allowed)

    @classmethod
    def measure(cls, *, host: str, service: str, algorithm: str, url: str, settings: PerfSettings, native: bool,
                model: str = "default", headers: Mapping[str, str] | None = None, progress: bool | None = None,
                runner: Runner = run_load, say: Callable[[str], None] = lambda message: None,
                flush_refused: str | None = None) -> ServiceRun:
        """Load the service; a run in which the client was saturated is measured again (``retries``).

        `flush_refused`: why /flush_cache may not be sent; the run then reads no server-side accept length (it
        would be cumulative since the server started, other traffic included) and says so.
        """
        speculative = algorithm != "NONE"
        spec = settings.load_spec(native=native, speculative=speculative, model=model,
                                  may_flush=flush_refused is None)
        skipped = (f"not read: it is only meaningful after a /flush_cache, which was not sent: {flush_refused}"
                   if flush_refused is not None and native and speculative else None)
        started = time.monotonic()
        saturated = 0
        attempt = 0
        result: LoadResult | None = None
        for attempt in range(1, settings.retries + 2):
            result = runner(url, spec, headers=headers, progress=progress, keep_token_times=True)
            if not result.client_saturated:
                break
            saturated += 1
            say(f"{host}/{service}: the load client was saturated ({'; '.join(result.saturation.reasons)})"
                + (": measuring again" if attempt <= settings.retries else ""))
        assert result is not None
        return cls(host=host, service=service, algorithm=algorithm, settings=settings, result=result, native=native,
                   attempts=attempt, saturated_attempts=saturated, wall_s=time.monotonic() - started,
                   server_accept_skipped=skipped)

    @property
    def label(self) -> str:
        return f"{self.host}/{self.service}"

    @property
    def refusal(self) -> str | None:
        """Why no floor may be judged on this run (the client was the bottleneck), or None."""
        if not self.result.client_saturated:
            return None
        sat = self.result.saturation
        reasons = "; ".join(sat.reasons) or "saturated"
        spread = ""
        if sat.processes > 1:  # one saturated process of N refuses the whole run: its share measured the client
            which = ", ".join(str(k) for k in sat.saturated_processes) or "?"
            spread = (f"; the run was spread over {sat.processes} client processes and process(es) {which} "
                      "saturated, which refuses the whole run")
        return (f"the load client was saturated ({reasons}) in {self.saturated_attempts} of {self.attempts} "
                f"run(s): its numbers measure the client, not {self.label}{spread}")

    @property
    def accept_length(self) -> float | None:
        """Accept length from the requests' meta_info (Σ output tokens / Σ verify steps), else the server's."""
        spec = [r for r in self.result.successful if r.verify_ct]
        if spec:
            return sum(float(r.output_tokens or 0) for r in spec) / sum(float(r.verify_ct or 0) for r in spec)
        return self.result.server_accept_length

    @property
    def accept_length_by_category(self) -> dict[str, float]:
        """Accept length per dataset category (Σ output tokens / Σ verify steps of its requests); {} for synthetic
        prompts or a dataset without categories. Request i's category comes from the spec (the same seeded order)."""
        spec = self.result.spec
        if not spec.dataset:
            return {}
        try:
            workload = Workload(spec)
        except ValueError:
            return {}
        sums: dict[str, list[float]] = {}
        for r in self.result.successful:
            if not r.verify_ct:
                continue
            category = workload.item(r.index).category
            if category is None:
                continue
            entry = sums.setdefault(category, [0.0, 0.0])
            entry[0] += float(r.output_tokens or 0)
            entry[1] += float(r.verify_ct)
        return {name: round(tokens / steps, 4) for name, (tokens, steps) in sorted(sums.items()) if steps}

    def judge(self, judgements: Iterable[Judgement]) -> list[Judgement]:
        """Record judgements (the latest per key wins) and return them."""
        out = list(judgements)
        for judgement in out:
            self.judgements[judgement.key] = judgement
        return out

    def headline(self) -> str:
        m = self.result.metrics
        parts = [f"{m['output_throughput']:.1f} output tok/s", f"{m['completed']} requests in {m['duration']:.1f} s"]
        if m.get("p99_ttft_ms") is not None:
            parts.append(f"TTFT p50/p99 {m['median_ttft_ms']:.1f}/{m['p99_ttft_ms']:.1f} ms")
        if m.get("p99_itl_ms") is not None:
            parts.append(f"ITL p99 {m['p99_itl_ms']:.1f} ms")
        if self.accept_length is not None:
            server = self.result.server_accept_length
            parts.append(f"accept length {self.accept_length:.3f}"
                         + (f" (server {server:.3f})" if server is not None else ""))
        by_category = self.accept_length_by_category
        if by_category:
            parts.append("per category " + ", ".join(f"{k} {v:.2f}" for k, v in by_category.items()))
        return f"{self.label} ({self.algorithm}): " + ", ".join(parts)

    def metrics(self) -> dict[str, float]:
        """Numbers for the verdict's ``metrics`` (and the fleet summary / Prometheus): perf.<service>.<name>."""
        prefix = f"perf.{self.service}."
        m = self.result.metrics
        out: dict[str, float] = {}
        for name in ("output_throughput", "request_throughput", "completed", "failed", "duration", "median_ttft_ms",
                     "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "mean_tpot_ms", "p99_e2e_latency_ms",
                     "accept_length"):
            value = m.get(name)
            if isinstance(value, int | float) and math.isfinite(value):
                out[prefix + name] = round(float(value), 4)
        if self.result.server_accept_length is not None:
            out[prefix + "server_accept_length"] = round(self.result.server_accept_length, 4)
        for category, value in self.accept_length_by_category.items():
            out[f"{prefix}accept_length_by_category.{category}"] = value
        out[prefix + "concurrency"] = float(self.settings.concurrency)
        out[prefix + "client_saturated"] = 1.0 if self.result.client_saturated else 0.0
        for key, judgement in self.judgements.items():
            out[f"{prefix}{key}.pass"] = 1.0 if judgement.passed else 0.0
            if judgement.outcome == "inconclusive":
                out[f"{prefix}{key}.inconclusive"] = 1.0
            if judgement.bound is not None and math.isfinite(judgement.bound):
                out[f"{prefix}{key}.bound"] = round(judgement.bound, 4)
        for versus, comparison in self.comparisons.items():
            out[f"{prefix}speedup_vs_{versus}"] = round(comparison.point, 4)
            out[f"{prefix}speedup_vs_{versus}.lower"] = round(comparison.lower, 4)
            out[f"{prefix}speedup_vs_{versus}.upper"] = round(comparison.upper, 4)
        return out

    def summary(self) -> dict[str, Any]:
        """A small JSON-able record for the terminal summary (sent from xdist workers in the report)."""
        m = self.result.metrics
        throughput = self.judgements.get("output_tok_s")
        lower = throughput.lower if throughput is not None else None
        upper = throughput.upper if throughput is not None else None
        return {
            "host": self.host, "service": self.service, "algorithm": self.algorithm,
            "describe": self.settings.describe(self.native), "output_tok_s": m["output_throughput"],
            "lower": lower, "upper": upper, "completed": m["completed"], "failed": m["failed"],
            "median_ttft_ms": m.get("median_ttft_ms"), "p99_ttft_ms": m.get("p99_ttft_ms"),
            "p99_itl_ms": m.get("p99_itl_ms"), "accept_length": self.accept_length,
            "accept_length_by_category": self.accept_length_by_category,
            "server_accept_length": self.result.server_accept_length, "saturated": self.result.client_saturated,
            "outcomes": {k: j.outcome for k, j in self.judgements.items()},
            "comparisons": [c.describe() for c in self.comparisons.values()],
        }

    def document(self) -> dict[str, Any]:
        """The per-service JSON: bench_serving's field names at the top level, then ``dflash_perf``."""
        doc: dict[str, Any] = json.loads(self.result.to_json())
        doc["dflash_perf"] = {
            "host": self.host, "service": self.service, "algorithm": self.algorithm,
            "settings": asdict(self.settings), "attempts": self.attempts,
            "saturated_attempts": self.saturated_attempts, "refused": self.refusal,
            "server_accept_length_skipped": self.server_accept_skipped,
            "judgements": [j.as_dict() for j in self.judgements.values()],
            "comparisons": [asdict(c) for c in self.comparisons.values()],
            "baseline": self.baseline,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        return doc

    def write(self, path: Path) -> Path:
        _write_json(path, self.document())
        return path


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1, allow_nan=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------------------
# Baselines
# ------------------------------------------------------------------------------------------------

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(name: str) -> str:
    return _SAFE.sub("_", name)


def baseline_path(directory: Path, host: str, service: str) -> Path:
    """``<directory>/<host>/<service>.json``."""
    return directory / safe_name(host) / f"{safe_name(service)}.json"


def save_baseline(run: ServiceRun, path: Path) -> Path:
    """Record a good run (its records too: the next run's comparison resamples both)."""
    doc = run.document()
    doc["dflash_perf"]["recorded"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    _write_json(path, doc)
    return path


@dataclass(frozen=True)
class Baseline:
    path: Path
    result: LoadResult
    recorded: str


def load_baseline(path: Path) -> Baseline:
    """A baseline written by :func:`save_baseline`; ValueError (naming the file) when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
        result = LoadResult.from_json(text)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable perf baseline ({type(exc).__name__}: {exc})") from None
    meta = doc.get("dflash_perf") if isinstance(doc, dict) else None
    recorded = str(meta.get("recorded", "")) if isinstance(meta, dict) else ""
    return Baseline(path, result, recorded or time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result.end_wall)))


def judge_baseline(run: ServiceRun, baseline: Baseline, floors: Mapping[str, float | str]) -> list[Judgement]:
    """Regression of ``BASELINE_METRICS`` beyond ``regression_pct`` (default 10 %); old vs new in the message."""
    raw_pct = floors.get("regression_pct", DEFAULT_REGRESSION_PCT)
    pct = float(raw_pct) if isinstance(raw_pct, int | float) else DEFAULT_REGRESSION_PCT
    confidence = confidence_of(floors)
    if run.refusal:
        return [_refused("baseline", run)]
    diff = _same_load(run.result.spec, baseline.result.spec)
    if diff:
        return [_refused("baseline", run, why=f"the baseline {baseline.path} was recorded with another load "
                                              f"({', '.join(diff)}): record a new one with --update-baseline")]
    out: list[Judgement] = []
    for metric in BASELINE_METRICS:
        try:
            current, old = metric_sample(run.result, metric), metric_sample(baseline.result, metric)
        except ValueError:
            continue  # e.g. no accept length on a NONE service
        key = f"baseline.{metric}"
        verdict = judge_regression(f"{metric} vs baseline", current, old, max_regression_pct=pct,
                                   confidence=confidence)
        now, then = _sample_point(current), _sample_point(old)
        change = (now / then - 1) * 100 if then else math.nan
        unit = UNITS.get(metric, "")
        detail = (f"; {metric} {_fmt(then, 4)} -> {_fmt(now, 4)} {unit} ({change:+.1f}%) since the baseline recorded "
                  f"{baseline.recorded}")
        out.append(Judgement.of(key, verdict, message=verdict.message + detail))
    if not out:
        out.append(Judgement(key="baseline", outcome="inconclusive",
                             message=f"baseline: INCONCLUSIVE — no statistic in common with {baseline.path}"))
    return out


def _sample_point(sample: Sample) -> float:
    """The point estimate of a ratio sample (throughput, accept length): scale · Σ values / Σ denominators."""
    if sample.denominators is None:
        return float(sample.values.mean())
    total = float(sample.denominators.sum())
    return sample.scale * float(sample.values.sum()) / total if total else math.nan
