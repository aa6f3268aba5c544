"""What a load run sends, how fast and for how long: :class:`LoadSpec`, its length distributions
and SLOs. Pure validation, no I/O (requests are built from a spec in :mod:`.workload`)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeAlias

__all__ = ["ENDPOINT_PATHS", "Endpoint", "LengthDist", "LoadSpec", "Slo", "as_dist"]


Endpoint: TypeAlias = Literal["chat", "completions", "generate"]
ENDPOINT_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "generate": "/generate",
}


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


def as_dist(value: int | LengthDist) -> LengthDist:
    """A length as a distribution: a plain int is a fixed length (``LengthDist(mean=value)``)."""
    return value if isinstance(value, LengthDist) else LengthDist(mean=int(value))


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Service-level objectives for goodput: a request is *good* when it meets every one set
    (:meth:`.results.RequestRecord.meets`)."""

    ttft_ms: float | None = None
    itl_ms: float | None = None  # on the request's p99 ITL
    tpot_ms: float | None = None
    e2e_ms: float | None = None


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    """What to send, how fast, for how long, and what counts as good.

    Load shape: ``request_rate=None`` is closed loop with ``concurrency`` requests always in flight
    (default 1). ``request_rate`` (req/s) is open loop with seeded Poisson arrivals; ``concurrency``
    then caps the requests in flight (None = no cap). The run stops issuing at ``num_requests`` or
    after ``duration_s`` (whichever comes first; at least one must be set); requests in flight then
    finish (within ``request_timeout_s``). ``warmup_requests`` run first (same shape, closed loop)
    and are excluded from every aggregate. ``client_procs`` > 1 spreads the run over that many
    processes (:mod:`.procs`): request *i* is the same request as in a one-process run.
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
    # JSONL {"prompt", "category"?, "output_len"?} / ShareGPT / "builtin" (workload.py)
    dataset: str | None = None
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
    client_procs: int = 1  # client processes the run is spread over (run_load; each its own loop and pool)

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
        if self.client_procs < 1:
            raise ValueError(f"LoadSpec.client_procs must be >= 1, got {self.client_procs}")
        cap = self.effective_concurrency()
        if cap is not None and self.client_procs > cap:
            raise ValueError(f"LoadSpec.client_procs ({self.client_procs}) > concurrency ({cap}): every "
                             "client process needs at least one request in flight")
        as_dist(self.prompt_len)
        as_dist(self.output_len)

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
