"""What a sweep runs: the levels ([perf] sweep, or --perf-sweep for a one-off), the requests per level, the
time budget over the whole sweep, and how each level's load is shaped (the service's [perf] settings at that
concurrency).

    plan = SweepPlan.resolve(profile.perf, override=(1, 4, 16))
    settings = plan.settings_at(PerfSettings.resolve(profile.perf, "dflash"), 16)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_dflash.layers.perf.settings import PerfSettings

__all__ = ["MIN_BLOCKS", "MIN_REQUESTS", "SweepPlan", "default_requests", "describe_budget"]

# Throughput is resampled in blocks of `concurrency` requests (stats.py) and a judgement needs 20 units: the
# default per level gives 20 blocks; at least 30 requests so a p90 SLO can be bounded above (order statistics:
# 29 requests).
MIN_BLOCKS = 20
MIN_REQUESTS = 30


def default_requests(level: int) -> int:
    """Measured requests at `level` when [perf] sweep_requests is not set: 20 blocks of `level` requests."""
    return max(MIN_BLOCKS * level, MIN_REQUESTS)


def describe_budget(seconds: float) -> str:
    """120 -> '2m', 90 -> '90s'."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """The levels of a sweep and its limits."""

    levels: tuple[int, ...]
    requests: int | None = None  # [perf] sweep_requests: the same at every level; None: default_requests
    budget_s: float | None = None  # [perf] sweep_budget: a deadline over the whole sweep
    early_stop: bool = True  # a level that breaks its SLOs twice ends the service's sweep

    @classmethod
    def resolve(cls, perf: Mapping[str, Any], override: tuple[int, ...] | None = None) -> SweepPlan | None:
        """[perf] sweep / sweep_requests / sweep_budget (validated by config/tables/perf.py), --perf-sweep
        over the levels; None when neither asks for a sweep."""
        levels = override or tuple(int(x) for x in perf.get("sweep") or ())
        if not levels:
            return None
        return cls(levels=tuple(sorted(set(levels))), requests=perf.get("sweep_requests"),
                   budget_s=perf.get("sweep_budget"))

    def requests_at(self, level: int) -> int:
        return self.requests if self.requests is not None else default_requests(level)

    def settings_at(self, base: PerfSettings, level: int) -> PerfSettings:
        """The service's load at `level`: its [perf] shape, `level` requests in flight, a warm-up of one
        request per slot, a fixed number of requests (the budget bounds the time)."""
        return dataclasses.replace(base, concurrency=level, requests=self.requests_at(level), duration_s=None,
                                   warmup=level, client_procs=min(base.client_procs, level))

    def describe(self) -> str:
        budget = f", budget {describe_budget(self.budget_s)}" if self.budget_s is not None else ""
        per_level = (f"{self.requests} requests per level" if self.requests is not None
                     else f"{MIN_BLOCKS} x concurrency requests per level (at least {MIN_REQUESTS})")
        return f"concurrency {', '.join(map(str, self.levels))}; {per_level}{budget}"
