"""[slo] and [slo.SERVICE]: the service-level objectives a load sweep judges every level against
(docs/perf.md, *Sweeps, SLOs and the crossover*), normalised.

    [slo]
    ttft_p99_ms = 500       # any latency statistic the perf layer measures: (ttft|tpot|itl|e2e)_pNN_ms
    tpot_p99_ms = 50
    [slo.ddtree]
    tpot_p99_ms = 80        # one service's own objective, over the table's

Normalised as {"default": {key: ms}, "services": {service: {key: ms}}}; `slo_for` merges them for a service.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.config.tables.floors import LATENCY_FLOOR
from pytest_dflash.config.tables.reader import Table, describe

__all__ = ["SLO_EXAMPLES", "parse_slo", "slo_for"]

SLO_EXAMPLES = ("ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "e2e_p99_ms")


def _objectives(table: Table, *, services: Mapping[str, ServiceSpec] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in table.items():
        if services is not None and isinstance(value, dict):
            continue  # [slo.SERVICE]: read by the caller
        latency = LATENCY_FLOOR.match(key)
        if latency is None:
            hint = f"a service of this host ({', '.join(services)}) or " if services is not None else ""
            raise table.fail(key, f"unknown SLO: expected {hint}a latency objective such as "
                                  f"{', '.join(SLO_EXAMPLES)} (ttft/tpot/itl/e2e _ mean/median/pNN _ms)")
        if latency.group(3) is not None and not 0 < float(latency.group(3)) < 100:
            raise table.fail(key, "unknown SLO: a percentile must be in (0, 100), e.g. ttft_p99_ms")
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise table.fail(key, f"expected a positive number of milliseconds, got {describe(value)}")
        out[key] = float(value)
    return out


def parse_slo(table: Table, services: Mapping[str, ServiceSpec]) -> dict[str, Any]:
    """[slo]: objectives for every service; [slo.SERVICE]: one service's, over them."""
    per_service = {key: _objectives(sub, services=None)
                   for key, sub in table.service_tables(services, "an SLO key")}
    return {"default": _objectives(table, services=services), "services": per_service}


def slo_for(slo: Mapping[str, Any], service: str) -> dict[str, float]:
    """The objectives judged on `service`: [slo], then [slo.SERVICE] over it ({} without an [slo] table)."""
    merged = dict(slo.get("default", {}))
    merged.update(dict(slo.get("services", {})).get(service, {}))
    return merged
