"""Where speculation stops paying, across a fleet and over nights: each host's load sweep read back from its
verdict's numbers (the perf layer's `perf.<svc>.sweep.*` metrics, layers/perf/sweep/book.py::sweep_metrics).

* :func:`sweep_entry` — per service of a host: the levels swept, the highest level within the SLOs and, per
  plain twin, the crossover (the first level confidently slower than the twin) or none up to the last level;
* :func:`speculation_lines` — the fleet summary's words for it, each speculative service ("not swept" too);
* :func:`crossover_changes` — the trend: a crossover that moved since the previous summary, with the level
  over the host's recent good runs ("crossover dflash vs none: 32 -> 8 since 2026-12-05").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["crossover_changes", "crossover_line", "crossover_state", "speculation_lines", "sweep_entry"]

_SWEEP = re.compile(r"^perf\.(?P<service>.+?)\.sweep\.(?P<rest>.+)$")
_LEVEL = re.compile(r"^c(?P<level>\d+)\.(?P<metric>output_tok_s|slo_pass|speedup_vs_(?P<twin>[^.]+))$")
_CROSSOVER = re.compile(r"^crossover_vs_(?P<twin>[^.]+)$")


def sweep_entry(metrics: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """{service: {"levels": [1, 4, 16], "slo": bool, "max_within_slo": 4 | None,
    "versus": {twin: {"crossover": 16 | None, "up_to": the last level compared}}}} for every swept service."""
    levels: dict[str, set[int]] = {}
    slo: dict[str, dict[int, bool]] = {}
    compared: dict[str, dict[str, list[int]]] = {}
    crossover: dict[str, dict[str, int]] = {}
    for key, value in metrics.items():
        found = _SWEEP.match(key)
        if found is None:
            continue
        service, rest = found["service"], found["rest"]
        if (level := _LEVEL.match(rest)) is not None:
            at = int(level["level"])
            if level["metric"] == "output_tok_s":
                levels.setdefault(service, set()).add(at)
            elif level["metric"] == "slo_pass":
                slo.setdefault(service, {})[at] = value == 1.0
            else:
                compared.setdefault(service, {}).setdefault(level["twin"], []).append(at)
        elif (cross := _CROSSOVER.match(rest)) is not None:
            crossover.setdefault(service, {})[cross["twin"]] = int(value)
    out: dict[str, dict[str, Any]] = {}
    for service, swept in sorted(levels.items()):
        passes = slo.get(service, {})
        highest = None
        for at in sorted(passes):  # every lower level passing too (gates.py: max_concurrency_within_slo)
            if not passes[at]:
                break
            highest = at
        twins = {twin: {"crossover": crossover.get(service, {}).get(twin), "up_to": max(at_levels)}
                 for twin, at_levels in sorted(compared.get(service, {}).items())}
        out[service] = {"levels": sorted(swept), "slo": bool(passes), "max_within_slo": highest,
                        "versus": twins}
    return out


def crossover_state(twin: Mapping[str, Any]) -> str:
    """'8' (the crossover level) or 'none up to 64' (no level confidently slower, up to the last compared)."""
    return str(twin["crossover"]) if twin.get("crossover") is not None else f"none up to {twin.get('up_to')}"


def speculation_lines(entry: Mapping[str, Any]) -> list[str]:
    """The fleet summary's words for a host: per speculative service, its crossover against each plain twin
    and the highest level within the SLOs, or 'not swept'."""
    sweep: Mapping[str, Any] = entry.get("sweep") or {}
    services: Mapping[str, Any] = entry.get("services") or {}
    speculative = [name for name, facts in services.items()
                   if str(facts.get("algorithm") or "NONE").upper() != "NONE"]
    speculative += [name for name, swept in sweep.items() if swept.get("versus") and name not in speculative]
    lines = []
    for name in speculative:
        swept = sweep.get(name)
        if not swept:
            lines.append(f"{name}: not swept")
            continue
        parts = []
        for twin, found in swept.get("versus", {}).items():
            parts.append(f"slower than {twin} from concurrency {found['crossover']}"
                         if found.get("crossover") is not None
                         else f"not slower than {twin} up to concurrency {found.get('up_to')}")
        if not swept.get("versus"):
            parts.append("no plain twin swept")
        if swept.get("slo"):
            within = swept.get("max_within_slo")
            parts.append(f"within SLO up to concurrency {within}" if within is not None
                         else "no level within SLO")
        else:
            parts.append("no SLO")
        lines.append(f"{name}: {'; '.join(parts)}")
    return lines


def _history_states(history: Sequence[Mapping[str, Any]], service: str, twin: str) -> list[dict[str, Any]]:
    """The crossover over the host's recent good runs, oldest first: [{finished, crossover}], runs that swept
    the pair only."""
    out = []
    for run in history:
        numbers = run.get("numbers") or {}
        found = sweep_entry(numbers).get(service, {}).get("versus", {}).get(twin)
        if found is not None:
            out.append({"finished": run.get("finished"), "crossover": crossover_state(found)})
    return out


def crossover_changes(hosts: Mapping[str, Mapping[str, Any]], before: Mapping[str, Mapping[str, Any]],
                      history: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
                      ) -> list[dict[str, Any]]:
    """Every crossover that moved since the previous summary (both runs swept the pair): {host, service,
    versus, previous, current, since (the previous run's finish), direction (worse: speculation stops paying
    at a lower load), history (the host's good runs)}."""
    changes = []
    for name, entry in sorted(hosts.items()):
        old = before.get(name)
        if old is None:
            continue
        then = sweep_entry(old.get("metrics") or {})
        now = entry.get("sweep") or sweep_entry(entry.get("metrics") or {})
        for service, swept in now.items():
            for twin, found in swept.get("versus", {}).items():
                was = then.get(service, {}).get("versus", {}).get(twin)
                if was is None or crossover_state(was) == crossover_state(found):
                    continue
                worse = _reach(found) < _reach(was)
                changes.append({"host": name, "service": service, "versus": twin,
                                "previous": crossover_state(was), "current": crossover_state(found),
                                "since": old.get("finished"), "direction": "worse" if worse else "better",
                                "history": _history_states((history or {}).get(name, ()), service, twin)})
    return changes


def _reach(twin: Mapping[str, Any]) -> float:
    """How far speculation pays: the crossover level, or past the last level compared when there is none."""
    if twin.get("crossover") is not None:
        return float(twin["crossover"])
    return float(twin.get("up_to") or 0) * 2


def crossover_line(change: Mapping[str, Any]) -> str:
    """'gpu-3 crossover dflash vs none: 32 -> 8 since 2026-12-05'."""
    since = str(change.get("since") or "")[:10]
    return (f"{change['host']} crossover {change['service']} vs {change['versus']}: {change['previous']} -> "
            f"{change['current']}" + (f" since {since}" if since else ""))
