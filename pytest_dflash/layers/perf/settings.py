"""How one service is loaded in a perf run: the profile's [perf] table, [perf.SERVICE] and the command line.

    settings = PerfSettings.resolve(profile.perf, "dflash", PerfOverrides(requests=800))
    spec = settings.load_spec(native=True, speculative=True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_dflash.load.spec import LoadSpec

__all__ = ["DEFAULT_REQUESTS", "PerfOverrides", "PerfSettings"]

DEFAULT_REQUESTS = 200


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
    # prompts instead of synthetic words (JSONL / ShareGPT / "builtin"); None: synthetic
    dataset: str | None = None

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

    def load_spec(self, *, native: bool, speculative: bool, model: str = "default",
                  may_flush: bool = True) -> LoadSpec:
        """The load generator's spec. Server-side accept length (/flush_cache, /server_info): native +
        speculative, and only where the run may flush the server's cache (`may_flush`: not on an attached
        server without opt-in)."""
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
