"""[perf] and [perf.SERVICE]: how the perf layer loads each service, normalised (durations in seconds)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.config.tables.reader import Table

PERF_ENDPOINTS = ("auto", "generate", "chat", "completions")
PERF_SERVICE_KEYS = ("requests", "duration", "warmup")
# A sweep is of concurrency levels: the perf layer's load is closed-loop, and concurrency is the batch the
# GPU sees (where speculation's advantage is decided); a request rate would be an open loop, not run here.
RATE_SWEEP = ("request-rate sweeps are not supported: the perf layer's load is closed-loop and a sweep's "
              "levels are concurrencies (the batch the GPU sees), e.g. sweep = [1, 4, 16, 64]")


def parse_sweep_levels(raw: object) -> tuple[int, ...] | str:
    """[perf] sweep / --perf-sweep: positive integer concurrencies, sorted, distinct; or why not (a line)."""
    if isinstance(raw, str):
        parts: list[object] = [p.strip() for p in raw.split(",") if p.strip()]
    elif isinstance(raw, list):
        parts = list(raw)
    else:
        return f"expected a list of concurrency levels such as [1, 4, 16, 64], got {raw!r}"
    levels: list[int] = []
    for part in parts:
        if isinstance(part, str) and part.isdigit():
            part = int(part)
        if isinstance(part, str) and any(u in part.lower() for u in ("/s", "rps", "qps", "rate")):
            return f"{part!r}: {RATE_SWEEP}"
        if isinstance(part, float) or (isinstance(part, str) and part.replace(".", "", 1).isdigit()):
            return f"{part!r} is not a whole number of requests in flight ({RATE_SWEEP})"
        if isinstance(part, bool) or not isinstance(part, int) or part < 1:
            return f"expected concurrency levels (integers >= 1), got {part!r}"
        levels.append(part)
    if not levels:
        return "expected at least one concurrency level, e.g. [1, 4, 16, 64]"
    return tuple(sorted(set(levels)))


def parse_perf(table: Table, services: Mapping[str, ServiceSpec],
               profile_dir: Path | None = None) -> dict[str, Any]:
    """[perf]: how the perf layer loads each service; [perf.SERVICE] overrides requests/duration/warmup.

    Values are normalised: durations in seconds (float), per-service tables under "services", `dataset` an
    absolute path (relative to the profile file; "builtin": the shipped prompt set), read and checked here.
    """

    def dataset(name: str) -> str | None:
        value = table.get(name, str)
        if value is None:
            return None
        from pytest_dflash.load.workload import BUILTIN_NAME, DatasetError, dataset_path, load_dataset

        path = (dataset_path(value) if value == BUILTIN_NAME
                else (profile_dir or Path.cwd()) / Path(value).expanduser())
        try:
            load_dataset(path)
        except DatasetError as exc:
            raise table.fail(name, str(exc)) from None
        return str(path.resolve())

    def count(sub: Table, name: str, low: int) -> int | None:
        value = sub.get(name, int)
        if value is not None and value < low:
            raise sub.fail(name, f"expected an integer >= {low}, got {value}")
        return value

    def number(sub: Table, name: str, *, positive: bool = True) -> float | None:
        value = sub.get(name, float)
        if value is not None and (value < 0 or (positive and value == 0)):
            raise sub.fail(name,
                           f"expected a {'positive' if positive else 'non-negative'} number, got {value!r}")
        return value

    def duration(sub: Table, name: str) -> float | None:
        value = sub.duration(name, -1.0)
        if value == -1.0:
            return None
        if not value > 0:
            raise sub.fail(name, f"expected a positive duration like '30s', got {sub.raw(name)!r}")
        return value

    out: dict[str, Any] = {}
    per_service: dict[str, dict[str, Any]] = {}
    for key, sub in table.service_tables(services, "a [perf] key"):
        entry = {"requests": count(sub, "requests", 1), "duration": duration(sub, "duration"),
                 "warmup": count(sub, "warmup", 0)}
        sub.done()
        per_service[key] = {k: v for k, v in entry.items() if v is not None}
    endpoint = table.choice("endpoint", PERF_ENDPOINTS)
    sweep: tuple[int, ...] | None = None
    if table.raw("sweep") is not None:
        parsed = parse_sweep_levels(table.raw("sweep"))
        if isinstance(parsed, str):
            raise table.fail("sweep", parsed)
        sweep = parsed
    values = {
        "endpoint": endpoint,
        "concurrency": count(table, "concurrency", 1),
        "requests": count(table, "requests", 1),
        "duration": duration(table, "duration"),
        "warmup": count(table, "warmup", 0),
        "prompt_len": count(table, "prompt_len", 1),
        "output_len": count(table, "output_len", 1),
        "temperature": number(table, "temperature", positive=False),
        "seed": count(table, "seed", 0),
        "request_timeout": duration(table, "request_timeout"),
        "max_loop_lag_ms": number(table, "max_loop_lag_ms"),
        "max_client_cpu": number(table, "max_client_cpu"),
        "retries": count(table, "retries", 0),
        "client_procs": count(table, "client_procs", 1),
        "dataset": dataset("dataset"),
        "sweep": list(sweep) if sweep is not None else None,
        "sweep_requests": count(table, "sweep_requests", 1),
        "sweep_budget": duration(table, "sweep_budget"),
    }
    for name in per_service:
        table.get(name, dict)  # seen
    table.done()
    out.update({k: v for k, v in values.items() if v is not None})
    if per_service:
        out["services"] = per_service
    return out
