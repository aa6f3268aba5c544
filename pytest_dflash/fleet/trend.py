"""A failing host's "what changed" since its last good verdict, and the trend against the previous summary
(new failures, fixed hosts, hosts that disappeared or appeared, perf deltas beyond a threshold)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_dflash.fleet.values import flatten, host_numbers, parse_time
from pytest_dflash.run.layers import LAYERS

FAILING = ("failed", "blocked")
MAX_CHANGES = 200  # per host, in the summary ("what changed" of a whole package set can be long)
# Service facts that are measurements of one run, not configuration: never "what changed".
VOLATILE_SERVICE_KEYS = frozenset({"ready", "accept_length", "provisioned", "ready_s"})
# Perf numbers where a smaller value is better (latencies, durations); the rest (tokens/s, accept length) grow.
LOWER_IS_BETTER = ("ttft", "itl", "tpot", "latency", "_ms", "duration", "ready_s", "e2e", "_p50", "_p90", "_p99",
                   "failed", "error", "inconclusive", "saturated")


def _category(key: str) -> str:
    lowered = key.lower()
    if ".packages." in lowered or lowered.endswith(".packages"):
        return "packages"
    if "jit" in lowered:
        return "jit-cache"
    if any(word in lowered for word in ("unit", "flag", "exec", "command", "args", "environment")):
        return "unit"
    if any(word in lowered for word in ("driver", "cuda", "nvidia")):
        return "driver"
    return "facts"


def _service_config(data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    services = data.get("services") or {}
    for name, facts in services.items():
        if not isinstance(facts, Mapping):
            continue
        for key, value in flatten({k: v for k, v in facts.items() if k not in VOLATILE_SERVICE_KEYS}).items():
            if key == "url" and facts.get("provisioned"):
                continue  # provisioned services get a free port each run
            out[f"services.{name}.{key}"] = value
    return out


def what_changed(good: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """Differences between a host's last good verdict and its current one: the env snapshot and other layer
    facts (packages, driver, unit flags, JIT cache) when both have them, and always the services' algorithm,
    version and configuration, the profile and the connection."""
    good_facts = flatten(good.get("facts") or {}, "facts")
    now_facts = flatten(current.get("facts") or {}, "facts")
    basis = "facts" if good_facts and now_facts else "services"
    changes: list[dict[str, Any]] = []
    if basis == "facts":
        for key in sorted(set(good_facts) | set(now_facts)):
            if good_facts.get(key) != now_facts.get(key):
                changes.append({"category": _category(key), "key": key,
                                "before": good_facts.get(key), "after": now_facts.get(key)})
    good_services, now_services = _service_config(good), _service_config(current)
    for key in sorted(set(good_services) | set(now_services)):
        if good_services.get(key) != now_services.get(key):
            changes.append({"category": "service", "key": key,
                            "before": good_services.get(key), "after": now_services.get(key)})
    for key in ("profile", "connection"):
        if good.get(key) != current.get(key):
            changes.append({"category": "profile", "key": key, "before": good.get(key), "after": current.get(key)})
    note = None
    if basis == "services" and (good_facts or now_facts):
        side = "the last good verdict" if not good_facts else "this verdict"
        note = f"{side} has no env/facts snapshot: only services and profile compared"
    elif basis == "services":
        note = "no env/facts snapshot in either verdict (run the env layer): only services and profile compared"
    return {
        "since": {"run_id": good.get("run_id"), "finished": good.get("finished"),
                  "finished_ts": parse_time(good.get("finished"))},
        "basis": basis,
        "note": note,
        "count": len(changes),
        "changes": changes[:MAX_CHANGES],
    }


# ---- trend vs the previous summary ---------------------------------------------------------------------------


def lower_is_better(metric: str) -> bool:
    lowered = metric.lower()
    return any(word in lowered for word in LOWER_IS_BETTER)


def perf_deltas(before: Mapping[str, float], after: Mapping[str, float], threshold_pct: float) -> dict[str, Any]:
    deltas: dict[str, Any] = {}
    for key in sorted(set(before) & set(after)):
        old, new = before[key], after[key]
        if old == new:
            continue
        pct = (new - old) / abs(old) * 100.0 if old else None
        worse = (new > old) if lower_is_better(key) else (new < old)
        significant = pct is None or abs(pct) >= threshold_pct
        deltas[key] = {"previous": old, "current": new, "delta": round(new - old, 6),
                       "pct": None if pct is None else round(pct, 2),
                       "regression": worse and significant, "significant": significant}
    return deltas


def _bad_layers(layers: Mapping[str, str]) -> set[str]:
    return {layer for layer, outcome in layers.items() if outcome in FAILING}


def build_trend(hosts: Mapping[str, dict[str, Any]], previous: Mapping[str, Any], *, source: str | None,
                excluded: Sequence[str], threshold_pct: float) -> dict[str, Any]:
    """`excluded`: host names or globs left out on purpose (they did not disappear)."""
    before: Mapping[str, Mapping[str, Any]] = previous.get("hosts", {})
    new_failures: list[dict[str, Any]] = []
    fixed: list[dict[str, Any]] = []
    still_failing: list[str] = []
    perf: list[dict[str, Any]] = []
    for name, entry in hosts.items():
        old = before.get(name)
        bad_now = _bad_layers(entry["layers"])
        if old is None:
            if entry["verdict"] == "fail":
                new_failures.append({"host": name, "was": "absent", "layers": sorted(bad_now, key=_rank),
                                     "diagnosis": _diagnosis_ids(entry)})
            continue
        bad_before = _bad_layers(old.get("layers", {}))
        if entry["verdict"] == "fail":
            newly = bad_now - bad_before
            if old.get("verdict") == "pass" or newly:
                new_failures.append({"host": name, "was": str(old.get("verdict")),
                                     "layers": sorted(newly or bad_now, key=_rank),
                                     "diagnosis": _diagnosis_ids(entry)})
            else:
                still_failing.append(name)
        elif old.get("verdict") == "fail":
            fixed.append({"host": name, "layers": sorted(bad_before, key=_rank)})
        deltas = perf_deltas(host_numbers(old), host_numbers(entry), threshold_pct)
        entry["perf_delta"] = deltas
        perf.extend({"host": name, "metric": key, **delta} for key, delta in deltas.items() if delta["significant"])
    perf.sort(key=lambda d: (not d["regression"], -abs(d["pct"] or 0.0), d["host"], d["metric"]))
    return {
        "previous": {"source": source, "generated": previous.get("generated"), "finished": _last_finished(previous),
                     "run_ids": previous.get("run_ids", []), "hosts": len(before)},
        "new_failures": new_failures,
        "fixed": fixed,
        "still_failing": still_failing,
        "new_hosts": sorted(set(hosts) - set(before)),
        "disappeared": sorted(name for name in set(before) - set(hosts)
                              if not any(fnmatch.fnmatchcase(name, pattern) for pattern in excluded)),
        "perf_threshold_pct": threshold_pct,
        "perf": perf,
    }


def _last_finished(summary: Mapping[str, Any]) -> str | None:
    """When the newest run of a summary finished (what "since the previous run" means), else when it was made."""
    runs = [r for r in summary.get("runs", []) if isinstance(r, Mapping) and parse_time(r.get("finished"))]
    if not runs:
        return summary.get("generated")
    return str(max(runs, key=lambda r: parse_time(r.get("finished")) or 0.0)["finished"])


def _rank(layer: str) -> int:
    return LAYERS.index(layer) if layer in LAYERS else len(LAYERS)


def _diagnosis_ids(entry: Mapping[str, Any]) -> list[str]:
    ids: list[str] = []
    for failure in entry.get("failures", []):
        for diagnosis in failure.get("diagnosis", []):
            if diagnosis["id"] not in ids:
                ids.append(diagnosis["id"])
    return ids
