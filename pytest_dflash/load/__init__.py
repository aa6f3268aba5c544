"""Load generator for OpenAI-compatible and SGLang-native streaming endpoints (httpx, asyncio).

One call, :func:`run_load` (or :func:`run_load_async`), drives a server with a :class:`LoadSpec`
and returns a :class:`LoadResult`: one :class:`RequestRecord` per request and aggregates named as
sglang ``bench_serving`` names them (``output_throughput``, ``mean_ttft_ms``, ``p99_itl_ms`` …).

What is measured, and where the clock is read
=============================================
* **Time stamps are taken at the socket.** The httpx client runs on an httpx transport of our own
  (:class:`_H1Transport`: HTTP/1.1 keep-alive on asyncio protocols) whose protocol reads
  ``time.perf_counter_ns()`` inside ``data_received`` — the moment the bytes reach user space —
  and hands that stamp out with the bytes of each read. So a busy parser cannot make a token look
  later than it arrived. It also de-chunks a response per read instead of per chunk, which is
  what makes the client cheap (see benchmarks/README.md).
* **TTFT** = arrival of the first *token event* − the moment the request (head and body, one
  ``write``) was handed to the kernel, after any connection set-up; ``send_delay_ms`` records pool
  wait + connect + httpx overhead before that. A token event is an SSE event that carries a token: chat
  ``delta.content``/``delta.reasoning_content`` present as a string (SGLang's first chunk carries
  the role and ``content: ""`` when the first token is out), completions ``choices[0].text`` a
  string, ``/generate`` an event whose ``meta_info.completion_tokens`` grew.
* **ITL** = gaps between consecutive token events (per SSE event; on ``/generate`` with speculative
  decoding one event may carry several tokens — ``event_tokens`` keeps the count, bench_serving
  would split the gap evenly). **TPOT** = (e2e − TTFT) / (output_tokens − 1). **e2e** = end of the
  stream (``[DONE]``) − request start.
* **Output tokens** come from the server: the usage chunk (``stream_options.include_usage``) on
  OpenAI endpoints, ``meta_info.completion_tokens`` on ``/generate`` — never from chunk counts. A
  stream without them is an error (``missing_usage``), not a guess.
* **Errors** are typed (:class:`ErrorKind`): HTTP status (with a body excerpt), connect failure,
  connection dropped, timeout, malformed SSE/JSON, stream ended without ``[DONE]``, an in-stream
  ``{"error": …}`` event, no token at all, missing usage, cancelled by the run deadline.
* **Nothing hangs**: connect/read/write/pool timeouts on every HTTP call, a total deadline per
  request (``request_timeout_s``), and a deadline for the whole run (``run_timeout_s``) after which
  in-flight requests are cancelled and recorded as ``cancelled``.
* **Self-awareness**: a ticker task measures event-loop lag, and the loop thread's CPU time is
  read around the run; when the client itself is the bottleneck ``LoadResult.client_saturated``
  is True with the reason, and a perf layer must not judge floors on that run.

Parsing does not ``json.loads`` every event: token events are recognised by byte patterns that
cannot occur inside a JSON string (quotes inside strings are escaped), and the events that carry
the facts (usage, the final ``/generate`` meta_info, error events) are decoded in full. Every event
is still checked to be a ``{…}`` object; ``LoadSpec.strict_json=True`` decodes every event.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import json
import math
import os
import random
import re
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeAlias, cast

import httpx
import numpy as np

from pytest_dflash import __version__

__all__ = [
    "ErrorKind",
    "LengthDist",
    "LoadResult",
    "LoadSpec",
    "RequestError",
    "RequestRecord",
    "Saturation",
    "Slo",
    "aggregate",
    "flush_cache",
    "make_client",
    "run_load",
    "run_load_async",
    "server_accept_length",
    "tokens_over_time",
]

Endpoint: TypeAlias = Literal["chat", "completions", "generate"]
ENDPOINT_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "generate": "/generate",
}
TOOL_NAME = "pytest-dflash.load"
_NS = 1_000_000  # ns per ms


# ------------------------------------------------------------------------------------------------
# Specification
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """A token-length distribution: fixed, or drawn per request (clipped to [low, high])."""

    kind: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    mean: int = 128
    stdev: float = 0.0  # normal / lognormal
    low: int = 1  # uniform range start, and the clip for all kinds
    high: int | None = None  # uniform range end, and the clip for all kinds

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "normal", "lognormal"):
            raise ValueError(f"LengthDist.kind: {self.kind!r} is not fixed/uniform/normal/lognormal")
        if self.mean < 1 or self.low < 1:
            raise ValueError(f"LengthDist: mean ({self.mean}) and low ({self.low}) must be >= 1")
        if self.kind == "uniform" and self.high is None:
            raise ValueError("LengthDist(kind='uniform') needs high")
        if self.high is not None and self.high < self.low:
            raise ValueError(f"LengthDist: high ({self.high}) < low ({self.low})")
        if self.stdev < 0:
            raise ValueError(f"LengthDist.stdev must be >= 0, got {self.stdev}")

    def sample(self, rng: random.Random) -> int:
        """One length, deterministic for a seeded ``rng``."""
        if self.kind == "fixed":
            value = float(self.mean)
        elif self.kind == "uniform":
            assert self.high is not None
            return rng.randint(self.low, self.high)
        elif self.kind == "normal":
            value = rng.gauss(self.mean, self.stdev)
        else:  # lognormal with the given mean and stdev of the distribution itself
            sigma2 = math.log1p((self.stdev / self.mean) ** 2)
            value = rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        hi = self.high if self.high is not None else 1 << 30
        return int(min(max(round(value), self.low), hi))


def _as_dist(value: int | LengthDist) -> LengthDist:
    return value if isinstance(value, LengthDist) else LengthDist(mean=int(value))


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Service-level objectives for goodput: a request is *good* when it meets every one set."""

    ttft_ms: float | None = None
    itl_ms: float | None = None  # on the request's p99 ITL
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, rec: RequestRecord) -> bool:
        """True when a successful request meets every objective that is set."""
        if not rec.ok or rec.ttft_ms is None:
            return False
        if self.ttft_ms is not None and rec.ttft_ms > self.ttft_ms:
            return False
        if self.itl_ms is not None and rec.itl_ms and float(np.percentile(rec.itl_ms, 99)) > self.itl_ms:
            return False
        tpot = rec.tpot_ms
        if self.tpot_ms is not None and tpot is not None and tpot > self.tpot_ms:
            return False
        return not (self.e2e_ms is not None and rec.e2e_ms is not None and rec.e2e_ms > self.e2e_ms)


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    """What to send, how fast, for how long, and what counts as good.

    Load shape: ``request_rate=None`` is closed loop with ``concurrency`` requests always in flight
    (default 1). ``request_rate`` (req/s) is open loop with seeded Poisson arrivals; ``concurrency``
    then caps the requests in flight (None = no cap). The run stops issuing at ``num_requests`` or
    after ``duration_s`` (whichever comes first; at least one must be set); requests in flight then
    finish (within ``request_timeout_s``). ``warmup_requests`` run first (same shape, closed loop)
    and are excluded from every aggregate.
    """

    endpoint: Endpoint = "chat"
    model: str = "default"
    concurrency: int | None = None
    request_rate: float | None = None
    num_requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    prompt_len: int | LengthDist = 128  # synthetic prompts: words ≈ tokens
    output_len: int | LengthDist = 128
    dataset: str | None = None  # JSONL: {"prompt": str, "output_len": int} per line
    seed: int = 0
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    ignore_eos: bool = True
    slo: Slo | None = None
    request_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    run_timeout_s: float | None = None  # default: duration (or an estimate) + request timeout + 30 s
    server_accept_length: bool = False  # POST /flush_cache before, GET /server_info after
    strict_json: bool = False  # decode every SSE event in full (slower; for debugging servers)
    max_loop_lag_ms: float = 5.0  # p99 event-loop lag above this = client saturated
    max_client_cpu: float = 0.9  # loop-thread CPU (cores) at or above this = client saturated

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"LoadSpec.endpoint: {self.endpoint!r} is not one of {sorted(ENDPOINT_PATHS)}")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("LoadSpec: set num_requests and/or duration_s")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"LoadSpec.num_requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"LoadSpec.duration_s must be > 0, got {self.duration_s}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"LoadSpec.concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and not (self.request_rate > 0 and math.isfinite(self.request_rate)):
            raise ValueError(f"LoadSpec.request_rate must be a finite rate > 0, got {self.request_rate}")
        if self.warmup_requests < 0:
            raise ValueError(f"LoadSpec.warmup_requests must be >= 0, got {self.warmup_requests}")
        if not self.request_timeout_s > 0 or not self.connect_timeout_s > 0:
            raise ValueError("LoadSpec: request_timeout_s and connect_timeout_s must be > 0")
        _as_dist(self.prompt_len)
        _as_dist(self.output_len)

    @property
    def closed_loop(self) -> bool:
        """True for a fixed number of requests in flight, False for Poisson arrivals."""
        return self.request_rate is None

    def effective_concurrency(self) -> int | None:
        """Requests in flight at most (None: open loop without a cap)."""
        if self.closed_loop:
            return self.concurrency or 1
        return self.concurrency

    def deadline_s(self) -> float:
        """The whole run's deadline, warm-up included."""
        if self.run_timeout_s is not None:
            return self.run_timeout_s
        if self.duration_s is not None:
            body = self.duration_s
        else:
            assert self.num_requests is not None
            per_req = self.request_timeout_s
            if self.request_rate is not None:
                body = self.num_requests / self.request_rate + per_req
            else:
                body = math.ceil(self.num_requests / (self.concurrency or 1)) * per_req
        warm = math.ceil(self.warmup_requests / (self.effective_concurrency() or 1)) * self.request_timeout_s
        return body + warm + self.request_timeout_s + 30.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (inverse: :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoadSpec:
        """Rebuild from :meth:`to_dict` output; unknown keys are a TypeError."""
        kw = dict(data)
        for key in ("prompt_len", "output_len"):
            if isinstance(kw.get(key), dict):
                kw[key] = LengthDist(**kw[key])
        if isinstance(kw.get("slo"), dict):
            kw["slo"] = Slo(**kw["slo"])
        return cls(**kw)


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


class ErrorKind(StrEnum):
    """Why a request failed."""

    HTTP_STATUS = "http_status"  # an HTTP answer other than 200
    CONNECT = "connect"  # no connection (refused, unreachable, connect timeout)
    DROPPED = "connection_dropped"  # the server closed/reset the connection mid-request
    TIMEOUT = "timeout"  # the request hit request_timeout_s (stalled server)
    MALFORMED = "malformed"  # an SSE event that is not a JSON object, or JSON of the wrong shape
    INCOMPLETE = "incomplete"  # the stream ended cleanly but without data: [DONE]
    SERVER_ERROR = "server_error"  # an in-stream {"error": ...} event
    EMPTY = "empty"  # the stream finished without a single token event
    MISSING_USAGE = "missing_usage"  # no usage / completion_tokens: output tokens unknown
    CANCELLED = "cancelled"  # still in flight at the run deadline
    OTHER = "other"


@dataclass(frozen=True)
class RequestError:
    """A typed failure with the evidence: HTTP status and body excerpt where there was one."""

    kind: ErrorKind
    message: str
    status: int | None = None
    body: str = ""

    def __str__(self) -> str:
        status = f" HTTP {self.status}" if self.status is not None else ""
        body = f": {self.body[:200]}" if self.body else ""
        return f"{self.kind.value}{status}: {self.message}{body}"


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    """One request, as measured. Times are ms; ``*_s`` times are seconds since the run start."""

    index: int
    warmup: bool = False
    prompt_len: int = 0  # requested (synthetic words / dataset prompt words)
    max_tokens: int = 0  # requested output length
    scheduled_s: float | None = None  # open loop: the Poisson arrival time
    start_s: float = 0.0  # first request byte handed to the kernel
    end_s: float | None = None
    send_delay_ms: float = 0.0  # from our send() call to the first byte on the wire
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    event_tokens: list[int] | None = None  # /generate: tokens carried by each token event
    token_times_s: list[float] | None = None  # optional arrival times of token events (plots)
    e2e_ms: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    accept_length: float | None = None  # /generate meta_info.spec_accept_length
    verify_ct: int | None = None  # /generate meta_info.spec_verify_ct
    finish_reason: str | None = None
    error: RequestError | None = None

    @property
    def ok(self) -> bool:
        """True when the request completed with usage and at least one token."""
        return self.error is None

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first (bench_serving's definition)."""
        if self.e2e_ms is None or self.ttft_ms is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "error" and value is not None:
                value = {"kind": value.kind.value, "message": value.message, "status": value.status,
                         "body": value.body}
            elif f.name in ("itl_ms", "token_times_s") and value is not None:
                value = [round(v, 4) for v in value]
            elif isinstance(value, float):
                value = round(value, 4)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        kw = dict(data)
        err = kw.get("error")
        if isinstance(err, dict):
            kw["error"] = RequestError(kind=ErrorKind(err["kind"]), message=err["message"],
                                       status=err.get("status"), body=err.get("body", ""))
        return cls(**kw)


@dataclass(kw_only=True)
class Saturation:
    """How busy the client itself was; ``saturated`` means its numbers measure the client."""

    saturated: bool = False
    reasons: list[str] = field(default_factory=list)
    loop_lag_p50_ms: float = 0.0
    loop_lag_p99_ms: float = 0.0
    loop_lag_max_ms: float = 0.0
    loop_cpu: float = 0.0  # CPU seconds of the event-loop thread per wall second (cores)
    process_cpu: float = 0.0  # CPU seconds of the whole client process per wall second
    schedule_lag_p99_ms: float | None = None  # open loop: actual - planned send time


@dataclass(kw_only=True)
class LoadResult:
    """Everything a run produced: records, aggregates (bench_serving names), and its context."""

    spec: LoadSpec
    base_url: str
    records: list[RequestRecord]
    metrics: dict[str, Any]
    errors_by_kind: dict[str, int]
    saturation: Saturation
    server_accept_length: float | None = None
    start_wall: float = 0.0  # time.time() at the start of the measured phase
    end_wall: float = 0.0
    tool: str = TOOL_NAME
    tool_version: str = __version__
    notes: list[str] = field(default_factory=list)

    @property
    def client_saturated(self) -> bool:
        """True when the client was the bottleneck: do not judge server floors on this run."""
        return self.saturation.saturated

    @property
    def measured(self) -> list[RequestRecord]:
        """Records of the measured phase (warm-up excluded)."""
        return [r for r in self.records if not r.warmup]

    @property
    def successful(self) -> list[RequestRecord]:
        """Measured records without error."""
        return [r for r in self.records if not r.warmup and r.ok]

    def __getitem__(self, name: str) -> Any:
        return self.metrics[name]

    def to_json(self, *, indent: int | None = None, records: bool = True) -> str:
        """bench_serving-compatible top-level names, plus records and metadata."""
        doc: dict[str, Any] = {
            "tool": self.tool,
            "tool_version": self.tool_version,
            "base_url": self.base_url,
            "backend": "sglang" if self.spec.endpoint == "generate" else "sglang-oai",
            "start_wall": self.start_wall,
            "end_wall": self.end_wall,
            **self.metrics,
            "errors_by_kind": self.errors_by_kind,
            "server_accept_length": self.server_accept_length,
            "client_saturated": self.client_saturated,
            "saturation": asdict(self.saturation),
            "spec": self.spec.to_dict(),
            "notes": self.notes,
        }
        if records:
            doc["requests"] = [r.to_dict() for r in self.records]
        return json.dumps(doc, indent=indent, allow_nan=False, default=_json_default)

    @classmethod
    def from_json(cls, text: str) -> LoadResult:
        """Inverse of :meth:`to_json` (records required)."""
        doc = json.loads(text)
        spec = LoadSpec.from_dict(doc["spec"])
        records = [RequestRecord.from_dict(r) for r in doc.get("requests", [])]
        metric_names = set(_metric_names())
        metrics = {k: v for k, v in doc.items() if k in metric_names}
        return cls(spec=spec, base_url=doc["base_url"], records=records, metrics=metrics,
                   errors_by_kind=dict(doc.get("errors_by_kind", {})),
                   saturation=Saturation(**doc.get("saturation", {})),
                   server_accept_length=doc.get("server_accept_length"),
                   start_wall=doc.get("start_wall", 0.0), end_wall=doc.get("end_wall", 0.0),
                   tool=doc.get("tool", TOOL_NAME), tool_version=doc.get("tool_version", ""),
                   notes=list(doc.get("notes", [])))

    def summary(self) -> str:
        """A few human lines: throughput, latency, errors, saturation."""
        m = self.metrics
        lines = [
            f"{m['completed']}/{m['completed'] + m['failed']} ok in {m['duration']:.2f} s: "
            f"{m['output_throughput']:.1f} output tok/s, {m['request_throughput']:.2f} req/s",
            f"TTFT p50/p99 {_fmt(m['median_ttft_ms'])}/{_fmt(m['p99_ttft_ms'])} ms, "
            f"ITL p50/p99 {_fmt(m['median_itl_ms'])}/{_fmt(m['p99_itl_ms'])} ms, "
            f"TPOT mean {_fmt(m['mean_tpot_ms'])} ms",
        ]
        if m.get("accept_length") is not None:
            lines.append(f"accept length {m['accept_length']:.3f}")
        if self.errors_by_kind:
            lines.append("errors: " + ", ".join(f"{k}={v}" for k, v in sorted(self.errors_by_kind.items())))
        if self.client_saturated:
            lines.append("CLIENT SATURATED: " + "; ".join(self.saturation.reasons))
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _json_default(obj: object) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# ------------------------------------------------------------------------------------------------
# Aggregation (bench_serving names)
# ------------------------------------------------------------------------------------------------

_STAT_SUFFIXES = ("mean", "median", "std", "p50", "p90", "p99")
_SERIES = ("ttft", "tpot", "itl", "e2e_latency")


def _metric_names() -> list[str]:
    names = ["completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "input_throughput", "output_throughput", "total_throughput", "duration", "concurrency",
             "max_concurrency", "request_goodput", "goodput_fraction", "accept_length"]
    for series in _SERIES:
        names += [f"{s}_{series}_ms" for s in _STAT_SUFFIXES]
    names += [f"{s}_accept_length" for s in _STAT_SUFFIXES]
    return names


def _stats(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return dict.fromkeys(_STAT_SUFFIXES)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "median": float(p50), "std": float(arr.std()), "p50": float(p50),
            "p90": float(p90), "p99": float(p99)}


def aggregate(records: Sequence[RequestRecord], *, slo: Slo | None = None,
              max_concurrency: int | None = None, server_accept_length: float | None = None
              ) -> tuple[dict[str, Any], dict[str, int]]:
    """bench_serving-style aggregates over the measured records, and error counts by kind.

    ``duration`` runs from the first measured request's start to the last one's end, so requests
    still in flight when the issuing stopped are counted with their tokens (no cut-off bias).
    """
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    errors: dict[str, int] = {}
    for r in measured:
        if r.error is not None:
            errors[r.error.kind.value] = errors.get(r.error.kind.value, 0) + 1
    starts = [r.start_s for r in measured]
    ends = [r.end_s for r in measured if r.end_s is not None]
    duration = (max(ends) - min(starts)) if starts and ends else 0.0
    dur = duration if duration > 0 else math.nan
    total_in = sum(r.prompt_tokens or 0 for r in ok)
    total_out = sum(r.output_tokens or 0 for r in ok)
    m: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(measured) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration": duration,
        "max_concurrency": max_concurrency,
    }

    def rate(x: float) -> float:
        return x / dur if duration > 0 else 0.0

    m["request_throughput"] = rate(len(ok))
    m["input_throughput"] = rate(total_in)
    m["output_throughput"] = rate(total_out)
    m["total_throughput"] = rate(total_in + total_out)
    e2e = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    m["concurrency"] = rate(sum(e2e) / 1000.0)
    series: dict[str, list[float]] = {
        "ttft": [r.ttft_ms for r in ok if r.ttft_ms is not None],
        "tpot": [t for r in ok if (t := r.tpot_ms) is not None],
        "itl": [x for r in ok for x in r.itl_ms],
        "e2e_latency": e2e,
    }
    for name, values in series.items():
        for suffix, value in _stats(values).items():
            m[f"{suffix}_{name}_ms"] = value
    accept = [r.accept_length for r in ok if r.accept_length is not None]
    for suffix, value in _stats(accept).items():
        m[f"{suffix}_accept_length"] = value
    verify = sum(r.verify_ct or 0 for r in ok if r.accept_length is not None)
    spec_tokens = sum(r.output_tokens or 0 for r in ok if r.accept_length is not None)
    if server_accept_length is not None:
        m["accept_length"] = server_accept_length
    elif verify > 0:
        m["accept_length"] = spec_tokens / verify  # token-weighted, as the server computes it
    else:
        m["accept_length"] = None
    if slo is not None:
        good = sum(1 for r in ok if slo.met_by(r))
        m["request_goodput"] = rate(good)
        m["goodput_fraction"] = good / len(measured) if measured else 0.0
    else:
        m["request_goodput"] = None
        m["goodput_fraction"] = None
    return m, errors


# ------------------------------------------------------------------------------------------------
# HTTP/1.1 transport for httpx that stamps every read at data_received
# ------------------------------------------------------------------------------------------------


class _Protocol(asyncio.Protocol):
    """Buffers received bytes with the perf_counter_ns() at which they reached user space."""

    _HIGH_WATER = 4 << 20

    def __init__(self) -> None:
        self.chunks: collections.deque[tuple[bytes, int]] = collections.deque()
        self.buffered = 0
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None
        self.eof = False
        self.lost = False
        self.exc: BaseException | None = None
        self.write_paused = False
        self.read_paused = False

    def data_received(self, data: bytes) -> None:
        self.chunks.append((data, time.perf_counter_ns()))
        self.buffered += len(data)
        if self.buffered > self._HIGH_WATER and not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.exc = exc
        self._wake()
        d = self.drain_waiter
        if d is not None and not d.done():
            d.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        d = self.drain_waiter
        if d is not None and not d.done():
            d.set_result(None)

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class _Connection:
    """One HTTP/1.1 connection: corked request writes, stamped reads."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol, origin: tuple[str, str, int]) -> None:
        self.transport = transport
        self.p = protocol
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.last_read_ns = 0  # arrival of the bytes returned by the last read()
        self.request_start_ns = 0  # the request (head + body, one write) handed to the kernel

    def usable(self) -> bool:
        """True when an idle connection can take a request (the server did not close it)."""
        p = self.p
        return not (p.lost or p.eof or p.chunks or self.transport.is_closing())

    async def send(self, data: bytes, request: httpx.Request, timeout: float | None) -> None:
        p = self.p
        if p.lost or self.transport.is_closing():
            raise httpx.WriteError("connection lost before the request was sent", request=request)
        self.request_start_ns = time.perf_counter_ns()
        self.transport.write(data)
        if p.write_paused:
            fut: asyncio.Future[None] = self.loop.create_future()
            p.drain_waiter = fut
            handle = self.loop.call_later(timeout, _expire, fut) if timeout is not None else None
            try:
                await fut
            except TimeoutError:
                raise httpx.WriteTimeout(f"request body blocked for {timeout} s", request=request) from None
            finally:
                p.drain_waiter = None
                if handle is not None:
                    handle.cancel()
            if p.lost:
                raise httpx.WriteError("connection lost while sending the request", request=request)

    async def read(self, request: httpx.Request, timeout: float | None) -> bytes:
        """Next received bytes (b"" at EOF); sets ``last_read_ns`` to their arrival time."""
        p = self.p
        if not p.chunks:
            if not (p.lost or p.eof):
                fut: asyncio.Future[None] = self.loop.create_future()
                p.waiter = fut
                handle = self.loop.call_later(timeout, _expire, fut) if timeout is not None else None
                try:
                    await fut
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no data for {timeout} s", request=request) from None
                finally:
                    p.waiter = None
                    if handle is not None:
                        handle.cancel()
            if not p.chunks:
                if p.exc is not None:
                    raise httpx.ReadError(f"{type(p.exc).__name__}: {p.exc}", request=request)
                return b""
        data, ts = p.chunks.popleft()
        p.buffered -= len(data)
        if p.read_paused and p.buffered < _Protocol._HIGH_WATER // 4:
            p.read_paused = False
            self.transport.resume_reading()
        self.last_read_ns = ts
        return data

    def close(self) -> None:
        self.transport.close()


_MAX_HEAD = 64 * 1024


class _Body(httpx.AsyncByteStream):
    """A response body read straight off the connection: one piece per read, de-chunked."""

    def __init__(self, transport: _H1Transport, conn: _Connection, request: httpx.Request, rest: bytes,
                 rest_ns: int, framing: str, length: int, reusable: bool, timeout: float | None) -> None:
        self._t = transport
        self.conn = conn
        self._request = request
        self._rest = rest
        self._rest_ns = rest_ns
        self._framing = framing  # "chunked" | "length" | "close" | "none"
        self._left = length
        self._reusable = reusable
        self._timeout = timeout
        self._done = framing == "none" or (framing == "length" and length == 0)
        self._closed = False
        # chunked decoder state
        self._buf = b""
        self._in_chunk = 0  # bytes of chunk data still to come
        self._need_crlf = False
        self._trailers = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn, request = self.conn, self._request
        if self._rest:
            data, self._rest = self._rest, b""
            conn.last_read_ns = self._rest_ns
            out = self._feed(data)
            if out:
                yield out
        while not self._done:
            data = await conn.read(request, self._timeout)
            if not data:
                if self._framing == "close":
                    self._done = True
                    self._reusable = False
                    break
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body", request=request)
            out = self._feed(data)
            if out:
                yield out

    def _feed(self, data: bytes) -> bytes:
        framing = self._framing
        if framing == "close":
            return data
        if framing == "length":
            if len(data) >= self._left:
                extra = data[self._left:]
                data = data[: self._left]
                self._left = 0
                self._done = True
                if extra:
                    self._reusable = False
                return data
            self._left -= len(data)
            return data
        return self._dechunk(data)

    def _dechunk(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        out: list[bytes] = []
        while pos < n or self._done:
            if self._done:
                if pos < n:
                    self._reusable = False  # bytes after the end of the message
                break
            if self._in_chunk:
                take = min(self._in_chunk, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._in_chunk -= take
                if self._in_chunk:
                    break
                self._need_crlf = True
            if self._need_crlf:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("malformed chunked encoding: no CRLF after chunk data",
                                                    request=self._request)
                pos += 2
                self._need_crlf = False
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 4096:
                    raise httpx.RemoteProtocolError("malformed chunked encoding: chunk header too long",
                                                    request=self._request)
                break
            line = buf[pos:eol]
            pos = eol + 2
            if self._trailers:
                if not line:
                    self._done = True
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"malformed chunk size line {line[:40]!r}",
                                                request=self._request) from None
            if size < 0:
                raise httpx.RemoteProtocolError("negative chunk size", request=self._request)
            if size == 0:
                self._trailers = True
            else:
                self._in_chunk = size
        self._buf = buf[pos:] if pos < n else b""
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._done and self._reusable and not self._buf:
            self._t._release(self.conn)
        else:
            self._t._discard(self.conn)


class _H1Transport(httpx.AsyncBaseTransport):
    """httpx transport: HTTP/1.1 keep-alive pool on asyncio protocols, stamped reads.

    Why not httpcore + h11: h11 turns every chunk of a chunked response into an event object and
    a trip through four async generators; an SSE stream is one chunk per token, so that was 60 % of
    the client's CPU. Here a response body is de-chunked per *read* (often a hundred tokens at once
    under load), and every piece carries the arrival time of the read it came from.
    """

    def __init__(self, *, max_connections: int | None, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._all: set[_Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        conn = await self._acquire(origin, request, timeouts)
        try:
            body = await request.aread()
            head = b"%s %s HTTP/1.1\r\n" % (request.method.encode(), url.raw_path)
            lines = [head]
            for name, value in request.headers.raw:
                lines.append(b"%s: %s\r\n" % (name, value))
            lines.append(b"\r\n")
            if body:
                lines.append(body)
            await conn.send(b"".join(lines), request, timeouts.get("write"))
            return await self._response(conn, request, timeouts.get("read"))
        except BaseException:
            self._discard(conn)
            raise

    async def _acquire(self, origin: tuple[str, str, int], request: httpx.Request,
                       timeouts: Mapping[str, float | None]) -> _Connection:
        """A connection for one request: an idle one if usable, else a new one (a slot each)."""
        if self._slots is not None:
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no free connection in the pool", request=request) from None
        try:
            idle = self._idle.get(origin)
            while idle:
                conn = idle.pop()
                if conn.usable():
                    return conn
                self._all.discard(conn)
                conn.close()
            return await self._connect(origin, request, timeouts.get("connect"))
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    async def _connect(self, origin: tuple[str, str, int], request: httpx.Request,
                       timeout: float | None) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        ssl_ctx: ssl.SSLContext | None = None
        if scheme == "https":
            ssl_ctx = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    _Protocol, host, port, ssl=ssl_ctx, server_hostname=host if ssl_ctx else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out after {timeout} s",
                                       request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"connect to {host}:{port}: {exc}", request=request) from exc
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(transport, protocol, origin)
        self._all.add(conn)
        return conn

    async def _response(self, conn: _Connection, request: httpx.Request, timeout: float | None) -> httpx.Response:
        buf = b""
        while True:
            data = await conn.read(request, timeout)
            if not data:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                                request=request)
            buf = buf + data if buf else data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise httpx.RemoteProtocolError("response head too large", request=request)
                continue
            head, buf = buf[:end], buf[end + 4:]
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}", request=request)
            status = int(parts[1])
            if 100 <= status < 200:  # informational (100 Continue): the real answer follows
                if buf:
                    conn.p.chunks.appendleft((buf, conn.last_read_ns))
                    conn.p.buffered += len(buf)
                buf = b""
                continue
            break
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}", request=request)
            headers.append((name.strip(), value.strip()))
        framing, length, keep = "close", 0, parts[0] != b"HTTP/1.0"
        for name, value in headers:
            lname = name.lower()
            if lname == b"transfer-encoding" and b"chunked" in value.lower():
                framing = "chunked"
            elif lname == b"content-length" and framing != "chunked":
                try:
                    length = int(value)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad content-length {value!r}", request=request) from None
                framing = "length"
            elif lname == b"connection":
                v = value.lower()
                if b"close" in v:
                    keep = False
                elif b"keep-alive" in v:
                    keep = True
        if request.method == "HEAD" or status in (204, 304):
            framing = "none"
        if framing == "close":
            keep = False
        stream = _Body(self, conn, request, buf, conn.last_read_ns, framing, length, keep, timeout)
        return httpx.Response(status, headers=headers, stream=stream,
                              extensions={"http_version": parts[0], "reason_phrase": parts[2] if len(parts) > 2
                                          else b"", "network_stream": conn})

    def _release(self, conn: _Connection) -> None:
        """An in-use connection whose response was read to the end goes back to the pool."""
        if self._slots is not None:
            self._slots.release()
        if conn.usable():
            self._idle.setdefault(conn.origin, []).append(conn)
        else:
            self._all.discard(conn)
            conn.close()

    def _discard(self, conn: _Connection) -> None:
        """An in-use connection that cannot be reused (error, unread body) is closed."""
        if self._slots is not None:
            self._slots.release()
        self._all.discard(conn)
        conn.close()

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()


def make_client(base_url: str, *, limit: int | None, timeout: httpx.Timeout,
                headers: Mapping[str, str] | None = None, stamped: bool = True) -> httpx.AsyncClient:
    """An httpx client for load: no env proxies, no retries; socket-stamped HTTP/1.1 by default.

    ``stamped=False`` uses httpx's stock transport (httpcore + h11): the stamp is then taken when a
    chunk reaches our code, and parsing costs several times more CPU per token.
    """
    transport: httpx.AsyncBaseTransport
    if stamped:
        transport = _H1Transport(max_connections=limit)
    else:
        limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit, keepalive_expiry=30.0)
        transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
    hdrs = {"content-type": "application/json", "accept": "text/event-stream"}
    hdrs.update(headers or {})
    return httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout, headers=hdrs,
                             trust_env=False, follow_redirects=False)


# ------------------------------------------------------------------------------------------------
# Requests: payloads
# ------------------------------------------------------------------------------------------------

_WORDS_TEXT = (
    "the of and to in is was for on that with as by at from his it an were are which this be or has "
    "had one their not but new after first two her its been they who also other year time can more "
    "city world into when most over some between many people state only three known where group "
    "during team used school while being under during part made game such later film series found "
    "name government since house early high system until well same each work both around album three "
    "north south west east season river club line family local second music public small great long "
    "best life power early market light water field story order point model stone "
)
_WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class _Item:
    prompt: str
    prompt_len: int
    max_tokens: int


def _load_dataset(path: str) -> list[tuple[str, int | None]]:
    items: list[tuple[str, int | None]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                prompt = obj["prompt"]
                if not isinstance(prompt, str):
                    raise TypeError("prompt is not a string")
                out = obj.get("output_len")
                if out is not None and (not isinstance(out, int) or out < 1):
                    raise TypeError("output_len is not a positive integer")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            items.append((prompt, out))
    if not items:
        raise ValueError(f"{path}: no prompts")
    return items


class _Workload:
    """Deterministic request i -> (prompt, lengths, body bytes), independent of scheduling."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.prompt_dist = _as_dist(spec.prompt_len)
        self.output_dist = _as_dist(spec.output_len)
        self.dataset = _load_dataset(spec.dataset) if spec.dataset else None
        if self.dataset is not None:
            order = list(range(len(self.dataset)))
            random.Random(spec.seed).shuffle(order)
            self.order = order

    def item(self, i: int) -> _Item:
        rng = random.Random(self.spec.seed * 1_000_003 + i)
        if self.dataset is not None:
            prompt, out = self.dataset[self.order[i % len(self.order)]]
            return _Item(prompt, len(prompt.split()), out if out is not None else self.output_dist.sample(rng))
        n = self.prompt_dist.sample(rng)
        out_len = self.output_dist.sample(rng)
        words = [str(i)] + [rng.choice(_WORDS) for _ in range(max(n - 1, 0))]
        return _Item(" ".join(words), n, out_len)

    def body(self, item: _Item) -> bytes:
        s = self.spec
        if s.endpoint == "generate":
            sp: dict[str, Any] = {"max_new_tokens": item.max_tokens, "temperature": s.temperature,
                                  "ignore_eos": s.ignore_eos}
            if s.top_p is not None:
                sp["top_p"] = s.top_p
            if s.top_k is not None:
                sp["top_k"] = s.top_k
            obj: dict[str, Any] = {"text": item.prompt, "sampling_params": sp, "stream": True}
        else:
            obj = {"model": s.model, "max_tokens": item.max_tokens, "temperature": s.temperature,
                   "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": s.ignore_eos}
            if s.top_p is not None:
                obj["top_p"] = s.top_p
            if s.top_k is not None:
                obj["top_k"] = s.top_k
            if s.endpoint == "chat":
                obj["messages"] = [{"role": "user", "content": item.prompt}]
            else:
                obj["prompt"] = item.prompt
        return json.dumps(obj, separators=(",", ":")).encode()


# ------------------------------------------------------------------------------------------------
# Requests: one streamed request
# ------------------------------------------------------------------------------------------------


class _Fail(Exception):
    def __init__(self, kind: ErrorKind, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.error = RequestError(kind, message, status, body)


_CT_RE = re.compile(rb'"completion_tokens":\s*(\d+)')
_TOKEN_PATTERNS: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"content":"', b'"reasoning_content":"'),
    "completions": (b'"text":"',),
}


def _excerpt(data: bytes, limit: int = 300) -> str:
    return data[:limit].decode("utf-8", "replace")


def _split_event(block: bytes) -> bytes | None:
    """The data of one SSE event block (lines joined by \\n); None for comment/field-only blocks."""
    if block.startswith(b"data: ") and b"\n" not in block:
        return block[6:]
    parts: list[bytes] = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
        elif line and not line.startswith(b":") and b":" not in line and line not in (b"event", b"id", b"retry"):
            raise _Fail(ErrorKind.MALFORMED, f"not an SSE line: {_excerpt(line, 120)!r}")
    if not parts:
        return None
    return b"\n".join(parts)


def _decode(payload: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload)
    except ValueError as exc:
        raise _Fail(ErrorKind.MALFORMED, f"SSE data is not JSON ({exc})", body=_excerpt(payload)) from None
    if not isinstance(obj, dict):
        raise _Fail(ErrorKind.MALFORMED, "SSE data is not a JSON object", body=_excerpt(payload))
    return obj


def _error_message(obj: Mapping[str, Any]) -> str:
    err = obj.get("error")
    if isinstance(err, Mapping):
        return str(err.get("message", err))
    return str(err)


async def _one_request(client: httpx.AsyncClient, path: str, endpoint: str, body: bytes,
                       rec: RequestRecord, t0_ns: int, strict: bool, keep_times: bool,
                       timeout_s: float) -> None:
    """Send one streamed request and fill ``rec``; never raises except CancelledError."""
    call_ns = time.perf_counter_ns()
    rec.start_s = (call_ns - t0_ns) / 1e9
    try:
        async with asyncio.timeout(timeout_s):
            await _stream(client, path, endpoint, body, rec, t0_ns, call_ns, strict, keep_times)
    except _Fail as f:
        rec.error = f.error
    except httpx.TimeoutException as exc:
        rec.error = RequestError(ErrorKind.TIMEOUT, f"{type(exc).__name__}: {exc}")
    except TimeoutError:
        rec.error = RequestError(ErrorKind.TIMEOUT, f"request_timeout_s ({timeout_s:g} s) reached")
    except httpx.ConnectError as exc:
        rec.error = RequestError(ErrorKind.CONNECT, str(exc) or type(exc).__name__)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        rec.error = RequestError(ErrorKind.DROPPED, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # one odd request must not end the run: it is recorded, typed "other"
        rec.error = RequestError(ErrorKind.OTHER, f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        rec.error = RequestError(ErrorKind.CANCELLED, "cancelled at the run deadline")
        rec.end_s = (time.perf_counter_ns() - t0_ns) / 1e9
        raise
    if rec.end_s is None:
        rec.end_s = (time.perf_counter_ns() - t0_ns) / 1e9


async def _stream(client: httpx.AsyncClient, path: str, endpoint: str, body: bytes, rec: RequestRecord,
                  t0_ns: int, call_ns: int, strict: bool, keep_times: bool) -> None:
    request = client.build_request("POST", path, content=body)
    resp = await client.send(request, stream=True)
    try:
        ns = resp.extensions.get("network_stream")
        stamped = isinstance(ns, _Connection)
        start_ns = call_ns
        if isinstance(ns, _Connection) and ns.request_start_ns >= call_ns:
            start_ns = ns.request_start_ns
        rec.start_s = (start_ns - t0_ns) / 1e9
        rec.send_delay_ms = (start_ns - call_ns) / _NS
        if resp.status_code != 200:
            excerpt = b""
            async for part in resp.aiter_raw():
                excerpt += part
                if len(excerpt) >= 2000:
                    break
            raise _Fail(ErrorKind.HTTP_STATUS, resp.reason_phrase or "error", resp.status_code, _excerpt(excerpt))
        encoded = resp.headers.get("content-encoding", "identity").lower() not in ("", "identity")
        chunks = resp.aiter_bytes() if encoded else resp.aiter_raw()
        if endpoint == "generate":
            await _consume_generate(chunks, ns if stamped else None, rec, start_ns, t0_ns, strict, keep_times)
        else:
            await _consume_openai(chunks, ns if stamped else None, rec, start_ns, t0_ns,
                                  _TOKEN_PATTERNS[endpoint], strict, keep_times)
    finally:
        await resp.aclose()


async def _consume_openai(chunks: Any, ns: _Connection | None, rec: RequestRecord, start_ns: int,
                          t0_ns: int, patterns: tuple[bytes, ...], strict: bool, keep_times: bool) -> None:
    """OpenAI chat/completions SSE: token events, then a usage chunk, then [DONE]."""
    buf = b""
    first_ns = last_ns = 0
    itl: list[float] = []
    times: list[float] | None = [] if keep_times else None
    usage: Mapping[str, Any] | None = None
    done = False
    pat0 = patterns[0]
    pat1 = patterns[1] if len(patterns) > 1 else None
    perf = time.perf_counter_ns
    async for chunk in chunks:
        ts = ns.last_read_ns if ns is not None else perf()
        if buf:
            chunk = buf + chunk
            buf = b""
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        pos = 0
        while True:
            end = chunk.find(b"\n\n", pos)
            if end < 0:
                buf = chunk[pos:]
                break
            block = chunk[pos:end]
            pos = end + 2
            if done:
                raise _Fail(ErrorKind.MALFORMED, "data after [DONE]", body=_excerpt(block))
            payload = block[6:] if block.startswith(b"data: ") and b"\n" not in block else _split_event(block)
            if payload is None:
                continue
            if payload[:1] != b"{" or payload[-1:] != b"}":
                if payload == b"[DONE]":
                    done = True
                    continue
                raise _Fail(ErrorKind.MALFORMED, "SSE data is not a JSON object", body=_excerpt(payload))
            token = pat0 in payload or (pat1 is not None and pat1 in payload)
            if strict or b'"usage":{' in payload or b'"error"' in payload or not token:
                obj = _decode(payload) if (strict or not token or b'"usage":{' in payload
                                          or b'"error"' in payload) else {}
                if "error" in obj and obj.get("error") is not None and "choices" not in obj:
                    raise _Fail(ErrorKind.SERVER_ERROR, _error_message(obj), body=_excerpt(payload))
                u = obj.get("usage")
                if isinstance(u, Mapping):
                    usage = u
                choices = obj.get("choices")
                if choices is not None and not isinstance(choices, list):
                    raise _Fail(ErrorKind.MALFORMED, "choices is not a list", body=_excerpt(payload))
                if strict and token and not choices:
                    token = False
                if choices:
                    fr = choices[0].get("finish_reason") if isinstance(choices[0], Mapping) else None
                    if fr is not None:
                        rec.finish_reason = str(fr)
            elif b'"finish_reason":"' in payload:
                i = payload.find(b'"finish_reason":"') + 17
                rec.finish_reason = payload[i:payload.find(b'"', i)].decode("utf-8", "replace")
            if token:
                if first_ns == 0:
                    first_ns = ts
                else:
                    itl.append((ts - last_ns) / _NS)
                last_ns = ts
                if times is not None:
                    times.append((ts - t0_ns) / 1e9)
    end_ns = perf()
    if buf.strip():
        raise _Fail(ErrorKind.INCOMPLETE, "stream ended inside an SSE event", body=_excerpt(buf))
    if not done:
        raise _Fail(ErrorKind.INCOMPLETE, "stream ended without data: [DONE]")
    if first_ns == 0:
        raise _Fail(ErrorKind.EMPTY, "stream finished without a token event")
    rec.ttft_ms = (first_ns - start_ns) / _NS
    rec.itl_ms = itl
    rec.token_times_s = times
    rec.e2e_ms = (end_ns - start_ns) / _NS
    rec.end_s = (end_ns - t0_ns) / 1e9
    if usage is None or not isinstance(usage.get("completion_tokens"), int):
        raise _Fail(ErrorKind.MISSING_USAGE, "no usage chunk with completion_tokens "
                    "(stream_options.include_usage ignored?)")
    rec.output_tokens = int(usage["completion_tokens"])
    pt = usage.get("prompt_tokens")
    rec.prompt_tokens = int(pt) if isinstance(pt, int) else None


async def _consume_generate(chunks: Any, ns: _Connection | None, rec: RequestRecord, start_ns: int,
                            t0_ns: int, strict: bool, keep_times: bool) -> None:
    """SGLang native /generate SSE: cumulative text/output_ids, meta_info.completion_tokens.

    The SSE framing loop is the same as _consume_openai's, written out on purpose: it runs once per token
    (~5 µs of client CPU each at full speed) and a shared generator would add a resume per event."""
    buf = b""
    first_ns = last_ns = 0
    itl: list[float] = []
    event_tokens: list[int] = []
    times: list[float] | None = [] if keep_times else None
    final: Mapping[str, Any] | None = None
    done = False
    last_ct = 0
    perf = time.perf_counter_ns
    async for chunk in chunks:
        ts = ns.last_read_ns if ns is not None else perf()
        if buf:
            chunk = buf + chunk
            buf = b""
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        pos = 0
        while True:
            end = chunk.find(b"\n\n", pos)
            if end < 0:
                buf = chunk[pos:]
                break
            block = chunk[pos:end]
            pos = end + 2
            if done:
                raise _Fail(ErrorKind.MALFORMED, "data after [DONE]", body=_excerpt(block))
            payload = block[6:] if block.startswith(b"data: ") and b"\n" not in block else _split_event(block)
            if payload is None:
                continue
            if payload[:1] != b"{" or payload[-1:] != b"}":
                if payload == b"[DONE]":
                    done = True
                    continue
                raise _Fail(ErrorKind.MALFORMED, "SSE data is not a JSON object", body=_excerpt(payload))
            match = None if strict else _CT_RE.search(payload)
            if match is not None and b'"finish_reason":null' in payload and b'"error"' not in payload:
                ct = int(match.group(1))
            else:
                obj = _decode(payload)
                if "error" in obj and "meta_info" not in obj:
                    raise _Fail(ErrorKind.SERVER_ERROR, _error_message(obj), body=_excerpt(payload))
                meta = obj.get("meta_info")
                if not isinstance(meta, Mapping) or not isinstance(meta.get("completion_tokens"), int):
                    raise _Fail(ErrorKind.MALFORMED, "event without meta_info.completion_tokens",
                                body=_excerpt(payload))
                ct = int(meta["completion_tokens"])
                if meta.get("finish_reason") is not None:
                    final = meta
            if ct > last_ct:
                if first_ns == 0:
                    first_ns = ts
                else:
                    itl.append((ts - last_ns) / _NS)
                last_ns = ts
                event_tokens.append(ct - last_ct)
                last_ct = ct
                if times is not None:
                    times.append((ts - t0_ns) / 1e9)
    end_ns = perf()
    if buf.strip():
        raise _Fail(ErrorKind.INCOMPLETE, "stream ended inside an SSE event", body=_excerpt(buf))
    if not done:
        raise _Fail(ErrorKind.INCOMPLETE, "stream ended without data: [DONE]")
    if first_ns == 0:
        raise _Fail(ErrorKind.EMPTY, "stream finished without a token event")
    rec.ttft_ms = (first_ns - start_ns) / _NS
    rec.itl_ms = itl
    rec.event_tokens = event_tokens
    rec.token_times_s = times
    rec.e2e_ms = (end_ns - start_ns) / _NS
    rec.end_s = (end_ns - t0_ns) / 1e9
    if final is None:
        raise _Fail(ErrorKind.MISSING_USAGE, "no final event with meta_info.finish_reason")
    rec.output_tokens = int(final["completion_tokens"])
    pt = final.get("prompt_tokens")
    rec.prompt_tokens = int(pt) if isinstance(pt, int) else None
    fr = final.get("finish_reason")
    rec.finish_reason = str(fr.get("type")) if isinstance(fr, Mapping) else str(fr)
    acc = final.get("spec_accept_length")
    vct = final.get("spec_verify_ct")
    rec.accept_length = float(acc) if isinstance(acc, (int, float)) else None
    rec.verify_ct = int(vct) if isinstance(vct, int) else None
    if rec.accept_length is None and rec.verify_ct:
        rec.accept_length = rec.output_tokens / rec.verify_ct


# ------------------------------------------------------------------------------------------------
# Self-awareness: event-loop lag ticker, CPU, progress, deadlines
# ------------------------------------------------------------------------------------------------


class _Monitor:
    """Ticks every ``interval_s``: loop lag, progress line. Reads loop-thread and process CPU."""

    def __init__(self, *, interval_s: float = 0.01, progress: bool, total: int | None,
                 duration_s: float | None) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self.progress = progress
        self.total = total
        self.duration_s = duration_s
        self._task: asyncio.Task[None] | None = None
        self._t0_wall = 0.0
        self._t0_thread = 0.0
        self._t0_proc = 0.0
        self.loop_cpu = 0.0
        self.process_cpu = 0.0
        self._shown = False
        self.done = self.errors = self.tokens = 0  # measured requests finished (kept incrementally)

    def finished(self, rec: RequestRecord) -> None:
        """Count one finished request for the progress line (O(1): no scan of the records)."""
        if not rec.warmup:
            self.done += 1
            self.errors += rec.error is not None
            self.tokens += rec.output_tokens or 0

    def start(self) -> None:
        self._t0_wall = time.perf_counter()
        self._t0_thread = time.thread_time()
        self._t0_proc = time.process_time()
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval_s
        last_draw = 0.0
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            loop.call_at(next_at, _set_none, fut)
            await fut
            now = loop.time()
            self.lags_ms.append((now - next_at) * 1e3)
            next_at = max(next_at + self.interval_s, now)
            if self.progress and now - last_draw >= 0.25:
                last_draw = now
                self._draw()

    def _draw(self) -> None:
        elapsed = time.perf_counter() - self._t0_wall
        if elapsed < 2.0 and not self._shown:
            return
        self._shown = True
        done, errs, toks = self.done, self.errors, self.tokens
        if self.total:
            frac = min(done / self.total, 1.0)
        elif self.duration_s:
            frac = min(elapsed / self.duration_s, 1.0)
        else:
            frac = 0.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r[{bar:<30}] {done} req  {elapsed:6.1f} s  {toks / max(elapsed, 1e-9):10,.0f} tok/s"
                         f"  errors {errs}  ")
        sys.stderr.flush()

    async def stop(self) -> None:
        wall = time.perf_counter() - self._t0_wall
        self.loop_cpu = (time.thread_time() - self._t0_thread) / wall if wall > 0 else 0.0
        self.process_cpu = (time.process_time() - self._t0_proc) / wall if wall > 0 else 0.0
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._shown:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


def _set_none(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _saturation(spec: LoadSpec, mon: _Monitor, schedule_lags_ms: list[float]) -> Saturation:
    lags = np.asarray(mon.lags_ms or [0.0])
    p50, p99 = (float(x) for x in np.percentile(lags, [50, 99]))
    sat = Saturation(loop_lag_p50_ms=p50, loop_lag_p99_ms=p99, loop_lag_max_ms=float(lags.max()),
                     loop_cpu=mon.loop_cpu, process_cpu=mon.process_cpu)
    if schedule_lags_ms:
        sat.schedule_lag_p99_ms = float(np.percentile(schedule_lags_ms, 99))
    if p99 > spec.max_loop_lag_ms:
        sat.reasons.append(f"event-loop lag p99 {p99:.1f} ms > {spec.max_loop_lag_ms:g} ms")
    if mon.loop_cpu >= spec.max_client_cpu:
        sat.reasons.append(f"client event loop used {mon.loop_cpu:.2f} cores >= {spec.max_client_cpu:g}")
    if sat.schedule_lag_p99_ms is not None and sat.schedule_lag_p99_ms > spec.max_loop_lag_ms:
        sat.reasons.append(f"open-loop send lag p99 {sat.schedule_lag_p99_ms:.1f} ms > "
                           f"{spec.max_loop_lag_ms:g} ms")
    sat.saturated = bool(sat.reasons)
    return sat


# ------------------------------------------------------------------------------------------------
# Server-side accept length
# ------------------------------------------------------------------------------------------------


async def flush_cache(base_url: str, *, headers: Mapping[str, str] | None = None,
                      timeout_s: float = 30.0) -> bool:
    """POST /flush_cache (resets SGLang's accept-length counters); False when refused (busy: 400)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=dict(headers or {}),
                                 trust_env=False) as client:
        resp = await client.post("/flush_cache")
        return resp.status_code == 200


async def server_accept_length(base_url: str, *, headers: Mapping[str, str] | None = None,
                               timeout_s: float = 30.0) -> float | None:
    """``internal_states[0].avg_spec_accept_length`` from /server_info (old: /get_server_info).

    It is cumulative since the server started or since the last successful /flush_cache.
    """
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=dict(headers or {}),
                                 trust_env=False) as client:
        resp = await client.get("/server_info")
        if resp.status_code == 404:
            resp = await client.get("/get_server_info")
        resp.raise_for_status()
        info = resp.json()
    states = info.get("internal_states") if isinstance(info, dict) else None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------


def _want_progress(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


async def run_load_async(base_url: str, spec: LoadSpec, *, headers: Mapping[str, str] | None = None,
                         progress: bool | None = None, keep_token_times: bool = False,
                         _stamped: bool = True) -> LoadResult:
    """Run ``spec`` against ``base_url`` inside the running event loop (see :func:`run_load`)."""
    base_url = base_url.rstrip("/")
    workload = _Workload(spec)
    path = ENDPOINT_PATHS[spec.endpoint]
    limit = spec.effective_concurrency()
    timeout = httpx.Timeout(spec.request_timeout_s, connect=spec.connect_timeout_s)
    records: list[RequestRecord] = []
    notes: list[str] = []
    schedule_lags_ms: list[float] = []
    server_acc: float | None = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spec.deadline_s()
    if spec.server_accept_length and not await flush_cache(base_url, headers=headers):
        notes.append("/flush_cache refused (server busy): server_accept_length includes earlier requests")

    monitor = _Monitor(progress=_want_progress(progress), total=spec.num_requests, duration_s=spec.duration_s)
    start_wall = end_wall = time.time()
    async with make_client(base_url, limit=limit, timeout=timeout, headers=headers, stamped=_stamped) as client:
        t0_ns = time.perf_counter_ns()
        counter = 0

        def new_record(warmup: bool) -> tuple[RequestRecord, bytes]:
            nonlocal counter
            item = workload.item(counter)
            rec = RequestRecord(index=counter, warmup=warmup, prompt_len=item.prompt_len,
                                max_tokens=item.max_tokens)
            counter += 1
            records.append(rec)
            return rec, workload.body(item)

        async def send(rec: RequestRecord, body: bytes) -> None:
            await _one_request(client, path, spec.endpoint, body, rec, t0_ns, spec.strict_json,
                               keep_token_times, spec.request_timeout_s)
            monitor.finished(rec)

        async def guarded(run: Callable[[], Awaitable[None]]) -> None:
            try:
                async with asyncio.timeout_at(deadline):
                    await run()
            except TimeoutError:
                notes.append(f"run deadline ({spec.deadline_s():.0f} s) reached: in-flight requests cancelled")

        monitor.start()
        try:
            if spec.warmup_requests:
                async def warm() -> None:
                    remaining = spec.warmup_requests

                    async def worker() -> None:
                        nonlocal remaining
                        while remaining > 0:
                            remaining -= 1
                            await send(*new_record(True))

                    await asyncio.gather(*(worker() for _ in range(min(limit or 8, spec.warmup_requests))))

                await guarded(warm)
            measure_start_ns = time.perf_counter_ns()
            start_wall = time.time()
            stop_at = None if spec.duration_s is None else measure_start_ns + int(spec.duration_s * 1e9)
            budget = spec.num_requests

            def more() -> bool:
                nonlocal budget
                if stop_at is not None and time.perf_counter_ns() >= stop_at:
                    return False
                if budget is not None:
                    if budget <= 0:
                        return False
                    budget -= 1
                return True

            if spec.closed_loop:
                async def closed() -> None:
                    async def worker() -> None:
                        while more():
                            await send(*new_record(False))

                    await asyncio.gather(*(worker() for _ in range(limit or 1)))

                await guarded(closed)
            else:
                assert spec.request_rate is not None
                rate = spec.request_rate

                async def open_loop() -> None:
                    arrivals = random.Random(spec.seed ^ 0x5EED_5EED)
                    sem = asyncio.Semaphore(limit) if limit else None
                    tasks: set[asyncio.Task[None]] = set()
                    base = loop.time()
                    planned = 0.0

                    async def launch(rec: RequestRecord, body: bytes) -> None:
                        if sem is None:
                            await send(rec, body)
                            return
                        async with sem:
                            await send(rec, body)

                    try:
                        while True:
                            planned += arrivals.expovariate(rate)
                            when = base + planned
                            if stop_at is not None and (measure_start_ns + int(planned * 1e9)) >= stop_at:
                                break
                            if not more():
                                break
                            fut: asyncio.Future[None] = loop.create_future()
                            loop.call_at(when, _set_none, fut)
                            await fut
                            schedule_lags_ms.append((loop.time() - when) * 1e3)
                            rec, body = new_record(False)
                            rec.scheduled_s = (measure_start_ns - t0_ns) / 1e9 + planned
                            task = loop.create_task(launch(rec, body))
                            tasks.add(task)
                            task.add_done_callback(tasks.discard)
                        if tasks:
                            await asyncio.gather(*tasks)
                    finally:
                        for task in tasks:
                            task.cancel()
                        if tasks:
                            await asyncio.gather(*tasks, return_exceptions=True)

                await guarded(open_loop)
            end_wall = time.time()
        finally:
            await monitor.stop()
        for rec in records:  # cancelled at the deadline before a record was finished
            if rec.error is None and rec.output_tokens is None:
                rec.error = RequestError(ErrorKind.CANCELLED, "cancelled at the run deadline")
                if rec.end_s is None:
                    rec.end_s = (time.perf_counter_ns() - t0_ns) / 1e9

    if spec.server_accept_length:
        try:
            server_acc = await server_accept_length(base_url, headers=headers)
        except httpx.HTTPError as exc:
            notes.append(f"/server_info failed: {type(exc).__name__}: {exc}")
    saturation = _saturation(spec, monitor, schedule_lags_ms)
    metrics, errors = aggregate(records, slo=spec.slo, max_concurrency=limit, server_accept_length=server_acc)
    return LoadResult(spec=spec, base_url=base_url, records=records, metrics=metrics, errors_by_kind=errors,
                      saturation=saturation, server_accept_length=server_acc, start_wall=start_wall,
                      end_wall=end_wall, notes=notes)


def run_load(base_url: str, spec: LoadSpec, *, headers: Mapping[str, str] | None = None,
             progress: bool | None = None, keep_token_times: bool = False) -> LoadResult:
    """Drive ``base_url`` with ``spec`` on a fresh event loop and return the measured result.

    ``headers`` are sent with every request (e.g. an Authorization header). ``progress``: None =
    a progress bar on stderr when it is a terminal and the run lasts more than 2 s; True/False
    force it. ``keep_token_times`` records each token event's arrival (for tokens/s-over-time plots).
    Uses uvloop when ``PYTEST_DFLASH_UVLOOP=1`` and uvloop is importable.
    """
    return _run_coro(run_load_async(base_url, spec, headers=headers, progress=progress,
                                    keep_token_times=keep_token_times))


def _run_coro(coro: Coroutine[Any, Any, LoadResult]) -> LoadResult:
    """asyncio.run, or uvloop.run when PYTEST_DFLASH_UVLOOP=1 and uvloop is installed."""
    if os.environ.get("PYTEST_DFLASH_UVLOOP") == "1":
        try:
            uvloop = importlib.import_module("uvloop")  # optional
        except ImportError:
            pass
        else:
            result: LoadResult = uvloop.run(coro)
            return result
    return asyncio.run(coro)


def tokens_over_time(records: Iterable[RequestRecord], *, bin_s: float = 1.0) -> list[tuple[float, float]]:
    """(bin start s, output tokens/s) from records with ``token_times_s`` (or spread over e2e)."""
    counts: dict[int, float] = {}
    for r in records:
        if r.warmup or not r.ok or not r.output_tokens:
            continue
        if r.token_times_s:
            per_event = r.event_tokens or [1] * len(r.token_times_s)
            scale = r.output_tokens / max(sum(per_event), 1)
            for t, k in zip(r.token_times_s, per_event, strict=False):
                b = int(t // bin_s)
                counts[b] = counts.get(b, 0.0) + k * scale
        elif r.end_s is not None and r.ttft_ms is not None:
            t1 = r.start_s + r.ttft_ms / 1000.0
            t2 = max(r.end_s, t1)
            n = r.output_tokens
            for j in range(n):  # uniform spread between first token and end
                t = t1 + (t2 - t1) * (j / max(n - 1, 1))
                b = int(t // bin_s)
                counts[b] = counts.get(b, 0.0) + 1.0
    if not counts:
        return []
    lo, hi = min(counts), max(counts)
    return [(b * bin_s, counts.get(b, 0.0) / bin_s) for b in range(lo, hi + 1)]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_dflash.load URL …``: one run, a summary on stdout, JSON to ``--out``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m pytest_dflash.load", description=main.__doc__)
    ap.add_argument("base_url")
    ap.add_argument("--endpoint", choices=sorted(ENDPOINT_PATHS), default="chat")
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--request-rate", type=float, default=None)
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--server-accept-length", action="store_true")
    ap.add_argument("--stock-httpx", action="store_true", help="httpx's own transport (httpcore + h11)")
    ap.add_argument("--out", default=None, help="write LoadResult JSON here")
    ap.add_argument("--no-records", action="store_true", help="leave per-request records out of --out")
    a = ap.parse_args(argv)
    spec = LoadSpec(endpoint=a.endpoint, model=a.model, concurrency=a.concurrency, request_rate=a.request_rate,
                    num_requests=a.num_requests, duration_s=a.duration, warmup_requests=a.warmup,
                    prompt_len=a.prompt_len, output_len=a.output_len, dataset=a.dataset, seed=a.seed,
                    temperature=a.temperature, request_timeout_s=a.request_timeout,
                    server_accept_length=a.server_accept_length)
    result = _run_coro(run_load_async(a.base_url, spec, _stamped=not a.stock_httpx))
    print(result.summary())
    if a.out:
        Path(a.out).write_text(result.to_json(records=not a.no_records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
