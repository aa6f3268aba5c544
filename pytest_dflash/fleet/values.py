"""Flat values of verdicts and summaries: timestamps, nested objects as dotted keys, their numbers, and a host
name made safe for a file name or an HTML anchor (:func:`safe_name`)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pytest_dflash.config.targets import file_name


def parse_time(value: Any) -> float | None:
    """A verdict's ISO time (`2026-11-30T04:53:28+0000`) -> unix seconds; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    for parse in (lambda v: datetime.strptime(v, "%Y-%m-%dT%H:%M:%S%z"), datetime.fromisoformat):
        try:
            return parse(value).timestamp()
        except ValueError:
            continue
    return None


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ts))


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested objects -> {"a.b.c": scalar}; a list of scalars stays one value, a list of objects is
    indexed."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list) and any(isinstance(item, Mapping | list) for item in value):
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{index}]"))
    else:
        out[prefix] = value
    return out


def numbers(value: Any) -> dict[str, float]:
    """The finite numeric leaves of a nested object (bools are not numbers)."""
    return {key: float(item) for key, item in flatten(value).items()
            if isinstance(item, int | float) and not isinstance(item, bool) and math.isfinite(item)}


def host_numbers(entry: Mapping[str, Any]) -> dict[str, float]:
    """Perf-like numbers of a summary host entry: perf metrics, then service readiness and accept length."""
    values = dict(entry.get("metrics", {}))
    for service, facts in entry.get("services", {}).items():
        for key in ("accept_length", "ready_s"):
            if isinstance(facts.get(key), int | float):
                values[f"service:{service}.{key}"] = float(facts[key])
    return values


def safe_name(name: str) -> str:
    """A host's name as a history folder or an HTML anchor: the verdict file's encoding, so two hosts never
    share one (config/targets.py::file_name)."""
    return file_name(name)


# The measured numbers among a verdict's metrics (what a dashboard charts and a trend compares), by the
# source's prefix; everything else there is a threshold (`ceiling_ms`, `max_tie_rate`, `.bound`), a setting
# (`concurrency`, `tie_gap`), an interval (`.lower` / `.upper`, kept for the trend's judging), a pass flag or
# a statistical test's internals, which stay in the JSON.
_MEASURED = re.compile(
    r"^(?:perf\.[^.]+\.(?:output_throughput|request_throughput|completed|failed|duration|median_ttft_ms"
    r"|p99_ttft_ms|median_itl_ms|p99_itl_ms|mean_tpot_ms|median_e2e_latency_ms|p99_e2e_latency_ms|accept_length"
    r"|server_accept_length"
    r"|speedup_vs_[^.]+|accept_length_by_category\.[^.]+)"
    r"|token_latency:[^.]+\.(?:ttft_ms|tpot_ms)"
    r"|acceptance:[^.]+\.(?:mean|accept_rate|per_category\.[^.]+)"
    r"|accept_ratio:[^.]+"
    r"|parity[\w-]*:[^.]+\.(?:exact_rate|tie_rate)"
    r"|service:[^.]+\.(?:ready_s|accept_length))$")


# A load sweep's numbers (layers/perf/sweep/book.py sweep_metrics): one per service, level and metric
# (`perf.dflash.sweep.c16.output_tok_s`; bounds, pass flags and gates excluded), and the crossover level
# (`perf.dflash.sweep.crossover_vs_none`): Prometheus gives them `service` and `level` labels.
_SWEEP = re.compile(r"^perf\.([^.]+)\.sweep\.c(\d+)\.([A-Za-z0-9_]+)$")
_CROSSOVER = re.compile(r"^perf\.([^.]+)\.sweep\.crossover_vs_([^.]+)$")


def sweep_samples(values: Mapping[str, float]) -> list[tuple[str, int, str, float]]:
    """(service, level, metric, value) of every sweep number among a verdict's metrics (slo_pass, a flag,
    left out)."""
    out = []
    for key, value in values.items():
        m = _SWEEP.match(key)
        if m is not None and m.group(3) != "slo_pass":
            out.append((m.group(1), int(m.group(2)), m.group(3), value))
    return out


def crossovers(values: Mapping[str, float]) -> list[tuple[str, str, float]]:
    """(service, twin, level) of every crossover a sweep found: where the service stops paying."""
    return [(m.group(1), m.group(2), value) for key, value in values.items()
            if (m := _CROSSOVER.match(key)) is not None]


def is_measurement(key: str) -> bool:
    """Whether a flattened metric key (`perf.dflash.output_throughput`) is a measured number, not a threshold,
    setting, interval or pass flag (`token_latency:none.ceiling_ms`, `perf.dflash.output_tok_s.bound`)."""
    return _MEASURED.match(key) is not None


def measurements(values: Mapping[str, float]) -> dict[str, float]:
    """The measured numbers of `values` (see :func:`is_measurement`), in their order."""
    return {key: value for key, value in values.items() if is_measurement(key)}
