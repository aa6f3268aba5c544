"""What a load run produced: typed per-request records and errors, the client's saturation, the
:class:`LoadResult` (JSON round trip, summary) and the bench_serving-named aggregates."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

import numpy as np

from pytest_dflash import __version__
from pytest_dflash.documents import loads_json
from pytest_dflash.load.spec import LoadSpec, Slo

__all__ = ["TOOL_NAME", "ErrorKind", "LoadResult", "RequestError", "RequestRecord", "Saturation", "aggregate",
           "tokens_over_time"]

TOOL_NAME = "pytest-dflash.load"


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

    def meets(self, slo: Slo) -> bool:
        """True when this request succeeded and meets every objective of ``slo`` that is set."""
        if not self.ok or self.ttft_ms is None:
            return False
        if slo.ttft_ms is not None and self.ttft_ms > slo.ttft_ms:
            return False
        if slo.itl_ms is not None and self.itl_ms and float(np.percentile(self.itl_ms, 99)) > slo.itl_ms:
            return False
        tpot = self.tpot_ms
        if slo.tpot_ms is not None and tpot is not None and tpot > slo.tpot_ms:
            return False
        return not (slo.e2e_ms is not None and self.e2e_ms is not None and self.e2e_ms > slo.e2e_ms)

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
    # A run over several client processes: lags and loop_cpu are the worst process's, process_cpu the sum,
    # and one saturated process saturates the run (its numbers 1..processes are listed).
    processes: int = 1
    saturated_processes: list[int] = field(default_factory=list)


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
        doc = loads_json(text)
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
        good = sum(1 for r in ok if r.meets(slo))
        m["request_goodput"] = rate(good)
        m["goodput_fraction"] = good / len(measured) if measured else 0.0
    else:
        m["request_goodput"] = None
        m["goodput_fraction"] = None
    return m, errors


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
