"""[floors.SERVICE]: the thresholds the perf and service layers judge a service by (docs/perf.md),
normalised."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.config.tables.reader import Table, describe, did_you_mean

FLOOR_KEYS = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "accept_length", "speedup_vs", "speedup")
FLOOR_SETTINGS = ("regression_pct", "confidence")
# Gates on a load sweep's curve (layers/perf/sweep/gates.py): `goodput_at = {16 = 5.0}` is kept flattened as
# "goodput_at.16" = 5.0; crossover_vs names the plain twin, speedup_up_to the level the speed-up must hold to.
SWEEP_FLOORS = ("max_concurrency_within_slo", "goodput_at", "crossover_vs", "speedup_up_to", "min_speedup")
# Cold-start budgets in seconds (layers/service/coldstart.py): the whole cold start (the wait until the first
# sampled answer), or one phase of it, named for the phase's end (services/phases.py PHASE_NAMES): e.g.
# `cuda_graphs_captured_s = 120` = from the KV cache allocated to the CUDA graphs captured at most 120 s.
COLD_START_FLOORS = ("cold_start_s", "process_started_s", "weights_loaded_s", "kv_cache_allocated_s",
                     "cuda_graphs_captured_s", "port_open_s", "first_greedy_s", "first_sampled_s")
FLOOR_KEYS: tuple[str, ...] = (*FLOOR_KEYS, *COLD_START_FLOORS)  # type: ignore[no-redef]
# Any latency ceiling load.py measures per request: ttft_p50_ms, itl_p99_ms, tpot_mean_ms, e2e_p90_ms, ...
LATENCY_FLOOR = re.compile(r"^(ttft|itl|tpot|e2e)_(mean|median|p(\d+(?:\.\d+)?))_ms$")


def parse_floors(table: Table, services: Mapping[str, ServiceSpec]) -> dict[str, dict[str, float | str]]:
    """[floors.SERVICE]: thresholds judged by the perf layer (docs/perf.md), validated and normalised."""
    floors: dict[str, dict[str, float | str]] = {}
    for service, _ in table.items():
        if service not in services:
            raise table.fail(service, f"expected a service of this host ({', '.join(services)})")
        sub = table.sub(service)
        assert sub is not None
        values: dict[str, float | str] = {}
        for key, value in sub.items():
            latency = LATENCY_FLOOR.match(key)
            if key not in (*FLOOR_KEYS, *FLOOR_SETTINGS, *SWEEP_FLOORS) and latency is None:
                raise sub.fail(key, "unknown floor" + did_you_mean(key, {*FLOOR_KEYS, *FLOOR_SETTINGS,
                                                                          *SWEEP_FLOORS}))
            if key == "goodput_at":
                values.update(_goodput_at(sub, value))
                continue
            if key in ("max_concurrency_within_slo", "speedup_up_to") and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise sub.fail(key, f"expected a concurrency level (an integer >= 1), got {describe(value)}")
            if key in ("speedup_vs", "crossover_vs"):
                if not isinstance(value, str) or value not in services or value == service:
                    others = ", ".join(name for name in services if name != service) or "none"
                    raise sub.fail(key, f"expected the name of another service of this host ({others}), "
                                        f"got {describe(value)}")
                values[key] = value
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise sub.fail(key, f"expected a positive number, got {describe(value)}")
            if key == "confidence" and not 0.5 < value < 1:
                raise sub.fail(key, f"expected a confidence level in (0.5, 1) such as 0.95, got {value!r}")
            if key == "regression_pct" and not value < 100:
                raise sub.fail(key, f"expected a percentage in (0, 100), got {value!r}")
            if latency is not None and latency.group(3) is not None and not 0 < float(latency.group(3)) < 100:
                raise sub.fail(key, "unknown floor: a percentile must be in (0, 100), e.g. ttft_p99_ms")
            values[key] = float(value)
        if ("crossover_vs" in values) != ("speedup_up_to" in values):
            missing = "speedup_up_to" if "crossover_vs" in values else "crossover_vs"
            raise sub.fail(missing, "missing required key: crossover_vs and speedup_up_to go together "
                                    "(crossover_vs = \"none\", speedup_up_to = 32)")
        if "min_speedup" in values and "crossover_vs" not in values:
            raise sub.fail("min_speedup", "needs crossover_vs and speedup_up_to (the crossover gate)")
        if ("speedup" in values) != ("speedup_vs" in values):
            missing = "speedup_vs" if "speedup" in values else "speedup"
            raise sub.fail(missing, "missing required key: speedup and speedup_vs go together "
                                    "(speedup_vs = \"none\", speedup = 2.0)")
        floors[service] = values
    return floors


def _goodput_at(sub: Table, value: object) -> dict[str, float]:
    """goodput_at = {16 = 5.0}: requests/s within the SLOs at a level, flattened to {"goodput_at.16": 5.0}."""
    if not isinstance(value, dict) or not value:
        raise sub.fail("goodput_at", f"expected a table of level = requests/s such as {{16 = 5.0}}, got "
                                     f"{describe(value)}")
    out: dict[str, float] = {}
    for level, floor in value.items():
        if not str(level).isdigit() or int(level) < 1:
            raise sub.fail(f"goodput_at.{level}", "expected a concurrency level (an integer >= 1) as the key")
        if isinstance(floor, bool) or not isinstance(floor, int | float) or not 0 < floor < math.inf:
            raise sub.fail(f"goodput_at.{level}",
                           f"expected a positive number of requests/s, got {describe(floor)}")
        out[f"goodput_at.{int(level)}"] = float(floor)
    return out
