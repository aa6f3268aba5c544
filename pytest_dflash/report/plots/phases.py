"""A service's start-up phases, from the verdict's `ready` / `stopped` dicts: their order, names, colours, and
where a start-up that never became ready stopped."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

# A service's start-up phases, in order: the name of the moment each one ENDS (the keys of ready["phases"], in
# seconds from the start of the wait), what happens until then, and its colour.
PHASES: dict[str, tuple[str, str]] = {
    "process_started": ("process start", "#9e9e9e"),
    "weights_loaded": ("loading weights", "#1f77b4"),
    "kv_cache_allocated": ("allocating KV cache", "#17becf"),
    "cuda_graphs_captured": ("capturing CUDA graphs", "#9467bd"),
    "port_open": ("until the port opened", "#8c564b"),
    "first_greedy": ("first greedy answer", "#2ca02c"),
    "first_sampled": ("first sampled answer (sampling JIT)", "#ff7f0e"),
}
OTHER_PHASE = ("other readiness checks", "#e0e0e0")


def seconds_of(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def cold_start_phases(ready: Mapping[str, object]) -> list[tuple[str, float, float]]:
    """(phase, start s, end s) from the start of the wait, in order, from `ready["phases"]` where the service
    reported them, and from `http_s` / `greedy_s` / `sampled_s` for the port and first answers it did not (an
    SGLang version that logs no line for one); what is left until `total_s` is "other"."""
    ends: dict[str, float] = {}
    for key, phase in (("http_s", "port_open"), ("greedy_s", "first_greedy"), ("sampled_s", "first_sampled")):
        if (value := seconds_of(ready.get(key))) is not None:
            ends[phase] = value
    raw = ready.get("phases")
    if isinstance(raw, Mapping):
        ends.update({str(k): t for k, v in raw.items() if (t := seconds_of(v)) is not None})
    known = [k for k in PHASES if k in ends] + [k for k in ends if k not in PHASES]
    out: list[tuple[str, float, float]] = []
    start = 0.0
    for name in sorted(known, key=lambda k: ends[k]):  # by time: a phase a version logs late still draws
        end = ends[name]
        out.append((name, start, end))
        start = end
    total = seconds_of(ready.get("total_s"))
    if total is not None and total > start + 1e-3:
        out.append(("other", start, total))
    return out


def phase_order(names: Iterable[str]) -> list[str]:
    """The phases among `names` in start-up order ("other" after the known ones), then any a version logs that
    this table does not know, sorted: the legend's order and the HTML table's columns."""
    seen = set(names)
    known = [p for p in [*PHASES, "other"] if p in seen]
    return known + sorted(seen - set(known))


def phase_style(name: str) -> tuple[str, str]:
    """A phase's (label, colour) in the timeline and the table."""
    if name == "other":
        return OTHER_PHASE
    return PHASES.get(name, (name.replace("_", " "), "#bcbd22"))


def stopped_phases(stopped: Mapping[str, object]) -> list[tuple[str, float, float]]:
    """The phases a start-up that never became ready finished: its time after the last one is where it
    stopped, not "other"."""
    return [phase for phase in cold_start_phases(stopped) if phase[0] != "other"]


def stopped_in(stopped: Mapping[str, object]) -> str:
    """Where a start-up that never became ready stopped, from the HTTP milestones it reached."""
    if seconds_of(stopped.get("http_s")) is None:
        return "before its port opened"
    if seconds_of(stopped.get("greedy_s")) is None:
        return "in its first greedy request"
    return "in its first sampled request"


