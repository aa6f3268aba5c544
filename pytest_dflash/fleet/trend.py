"""A failing host's "what changed" since its last good verdict (also for the per-run HTML report:
:func:`changes_since_good`, handed to report/html.py by plugin.py), and the trend against the previous summary
(new failures, fixed hosts, hosts that disappeared or appeared, perf changes beyond the run-to-run spread, a
crossover that moved: fleet/sweeps.py).

A perf number is a regression only when its change is outside what repeated good runs show (issue 26: a raw
percentage printed `ready_s 3.975 -> 4.495 (+13.1%)` for noise and taught people to ignore the line):
- a number with a bootstrap interval in both runs (`<key>.lower` / `<key>.upper`, the perf layer's
  throughput): worse, and the two intervals do not overlap;
- any other number (readiness time, latency percentiles, accept length): worse than every one of the host's
  last `HISTORY_WINDOW` good runs (`<history>/<host>/good-runs.json`) by more than `HISTORY_MARGIN`, judged
  only once `MIN_HISTORY` good runs are on record.
Each change carries the rule that judged it (`rule`), and the terminal line shows it.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.layers import LAYERS
from pytest_dflash.documents import loads_json
from pytest_dflash.fleet.changes import service_changes
from pytest_dflash.fleet.sweeps import crossover_changes
from pytest_dflash.fleet.values import flatten, host_numbers, is_measurement, parse_time, safe_name

FAILING = ("failed", "blocked")
MAX_CHANGES = 200  # per host, in the summary ("what changed" of a whole package set can be long)
# Perf numbers where a smaller value is better (latencies, durations); the rest (tokens/s, accept length)
# grow.
LOWER_IS_BETTER = ("ttft", "itl", "tpot", "latency", "_ms", "duration", "ready_s", "e2e", "_p50",
                   "_p90", "_p99", "failed", "error", "inconclusive", "saturated")
GOOD_RUNS = "good-runs.json"  # <history>/<host>/good-runs.json: the numbers of the host's recent good runs
GOOD_RUNS_KEPT = 20
GOOD_VERDICTS = ("pass", "partial")  # runs whose numbers join the spread
HISTORY_WINDOW = 5  # a single number is judged against the host's last 5 good runs …
MIN_HISTORY = 3  # … once at least 3 are on record (before that, nothing is flagged) …
HISTORY_MARGIN = 0.25  # … and flagged when worse than all of them by more than 25%.
INTERVAL = (".lower", ".upper")  # a number's interval, trended as part of that number, never by itself
NOT_TRENDED = (*INTERVAL, ".bound")


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
    services, not_compared = service_changes(good, current)
    changes = [*services, *changes]  # the services first: the command of one that never came up leads
    for key in ("profile", "connection"):
        if good.get(key) != current.get(key):
            changes.append({"category": "profile", "key": key, "before": good.get(key),
                            "after": current.get(key)})
    note = None
    if basis == "services" and (good_facts or now_facts):
        side = "the last good verdict" if not good_facts else "this verdict"
        note = f"{side} has no env/facts snapshot: only services and profile compared"
    elif basis == "services" and _env_ran(current):
        note = ("no env/facts snapshot in either verdict (the env layer ran but recorded none): packages, "
                "driver and JIT cache not compared")
    elif basis == "services":
        note = ("no env/facts snapshot in either verdict (the env layer did not run): packages, driver and "
                "JIT cache not compared")
    return {
        "since": {"run_id": good.get("run_id"), "finished": good.get("finished"),
                  "finished_ts": parse_time(good.get("finished"))},
        "basis": basis,
        "note": note,
        "not_compared": not_compared,
        "count": len(changes),
        "changes": changes[:MAX_CHANGES],
    }


def _env_ran(verdict: Mapping[str, Any]) -> bool:
    env = (verdict.get("layers") or {}).get("env")
    return isinstance(env, Mapping) and env.get("outcome") not in (None, "not-run")


# ---- trend vs the previous summary -------------------------------------------------------------------------


def lower_is_better(metric: str) -> bool:
    lowered = metric.lower()
    return any(word in lowered for word in LOWER_IS_BETTER)


def perf_deltas(before: Mapping[str, float], after: Mapping[str, float], threshold_pct: float,
                history: Sequence[Mapping[str, float]] = ()) -> dict[str, Any]:
    """Changes of the numbers both runs have. `significant`: |change| >= threshold_pct (shown in the tables);
    `regression`: worse beyond the run-to-run spread (`rule` says by which rule); `history`: the numbers of
    the host's recent good runs, newest last."""
    deltas: dict[str, Any] = {}
    for key in sorted(set(before) & set(after)):
        if key.endswith(NOT_TRENDED) or not is_measurement(key):  # a threshold moving is not a perf change
            continue
        old, new = before[key], after[key]
        if old == new:
            continue
        pct = (new - old) / abs(old) * 100.0 if old else None
        significant = pct is None or abs(pct) >= threshold_pct
        regression, rule = judge_change(key, before, after, history, threshold_pct)
        better = new < old if lower_is_better(key) else new > old
        deltas[key] = {"previous": old, "current": new, "delta": round(new - old, 6),
                       "pct": None if pct is None else round(pct, 2),
                       "direction": "better" if better else "worse",
                       "regression": regression, "significant": significant or regression, "rule": rule}
    return dict(sorted(deltas.items(), key=lambda kv: _delta_rank(kv[1])))


def _delta_rank(delta: Mapping[str, Any]) -> tuple[bool, bool, float]:
    """Regressions first, then the other changes for the worse, then the better ones; larger first within."""
    return (not delta["regression"], delta.get("direction") != "worse", -abs(delta["pct"] or 0.0))


def _interval(numbers: Mapping[str, float], key: str) -> tuple[float, float] | None:
    lower, upper = numbers.get(key + INTERVAL[0]), numbers.get(key + INTERVAL[1])
    return (lower, upper) if lower is not None and upper is not None else None


def judge_change(key: str, before: Mapping[str, float], after: Mapping[str, float],
                 history: Sequence[Mapping[str, float]], threshold_pct: float = 5.0) -> tuple[bool, str]:
    """(is the current value worse than the run-to-run spread allows, the rule as a phrase for the line).
    With intervals, the spread is the previous run's and this one's, and the change must also reach
    threshold_pct (an interval covers the sampling noise within a run, not the drift between runs: a tight one
    alone would flag a 2% change); otherwise the spread is the host's recent good runs (so a run after a
    failing one is still judged against the good ones, not against the failure)."""
    new = after[key]
    low_better = lower_is_better(key)
    was, now = _interval(before, key), _interval(after, key)
    if was is not None and now is not None:
        apart = now[1] < was[0] or now[0] > was[1]
        worse_apart = now[0] > was[1] if low_better else now[1] < was[0]
        shown = f"95% intervals [{now[0]:.4g}, {now[1]:.4g}] now and [{was[0]:.4g}, {was[1]:.4g}] before"
        old = before[key]
        small = bool(old) and abs(after[key] - old) / abs(old) * 100.0 < threshold_pct
        if not apart:
            return False, shown + " overlap: within run-to-run spread"
        if small:
            return False, shown + f" do not overlap, but the change is under {threshold_pct:g}%"
        return worse_apart, shown + " do not overlap"
    values = [run[key] for run in history[-HISTORY_WINDOW:] if key in run]
    if len(values) < MIN_HISTORY:
        return False, (f"not judged: {len(values)} good run{'s' if len(values) != 1 else ''} on record, "
                       f"{MIN_HISTORY} needed")
    low, high = min(values), max(values)
    margin = round(HISTORY_MARGIN * 100)
    if low_better:
        beyond = new > high + HISTORY_MARGIN * abs(high) if high else new > high
    else:
        beyond = new < low - HISTORY_MARGIN * abs(low) if low else new < low
    where = f"the last {len(values)} good runs' range {low:.4g}-{high:.4g}"
    return beyond, (f"outside {where} by > {margin}%" if beyond else f"within {where} + {margin}%")


def trend_line(change: Mapping[str, Any]) -> str:
    """`local service:ddtree.ready_s 3.97 -> 8.1 (+104.0%), outside the last 5 good runs' range 3.6-4.5
    by > 25%`"""
    pct = f" ({change['pct']:+.1f}%)" if change.get("pct") is not None else ""
    rule = f", {change['rule']}" if change.get("rule") else ""
    return f"{change['host']} {change['metric']} {change['previous']:g} -> {change['current']:g}{pct}{rule}"


# ---- the history of good runs' numbers ---------------------------------------------------------------------


def good_runs_path(root: Path, host: str) -> Path:
    return root / safe_name(host) / GOOD_RUNS


def read_good_runs(root: Path, host: str) -> list[dict[str, Any]]:
    """The host's recent good runs, oldest first: [{run_id, finished, finished_ts, numbers}]; [] when none or
    unreadable (a damaged file is as good as none: the next good run starts it again)."""
    try:
        data = loads_json(good_runs_path(root, host).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError, JSONDecodeError, DocumentTooDeep
        return []
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        return []
    return [r for r in runs if isinstance(r, dict) and isinstance(r.get("numbers"), dict)]


def history_numbers(root: Path | None, host: str) -> list[dict[str, float]]:
    if root is None:
        return []
    return [{k: float(v) for k, v in run["numbers"].items()
             if isinstance(v, int | float) and not isinstance(v, bool)}
            for run in read_good_runs(root, host)]


def record_good_runs(root: Path, hosts: Mapping[str, Mapping[str, Any]]) -> list[Path]:
    """Append the numbers (perf metrics with their intervals, readiness, accept length) of each host whose run
    was good to its good-runs.json, newest last, the last GOOD_RUNS_KEPT kept; returns the paths written.
    Good: `pass`, or `partial` (nothing failed, the run was narrowed: `suites/perf` alone is how perf is
    usually measured); never `fail` or `interrupted`."""
    from pytest_dflash.files import atomic_write

    written = []
    for name, entry in hosts.items():
        if entry.get("verdict") not in GOOD_VERDICTS:
            continue
        runs = read_good_runs(root, name)
        if any(r.get("run_id") == entry.get("run_id") and r.get("finished") == entry.get("finished")
               for r in runs):
            continue
        runs.append({"run_id": entry.get("run_id"), "finished": entry.get("finished"),
                     "finished_ts": entry.get("finished_ts"), "numbers": host_numbers(entry)})
        runs.sort(key=lambda r: r.get("finished_ts") or 0.0)
        path = good_runs_path(root, name)
        atomic_write(path, json.dumps({"host": name, "runs": runs[-GOOD_RUNS_KEPT:]}, indent=1) + "\n",
                     sync=False)
        written.append(path)
    return written


RULE = ("a number with a bootstrap interval in both runs regresses when it is worse, the intervals do not "
        "overlap and the change reaches the perf threshold; "
        f"any other number when it is worse than each of the host's last {HISTORY_WINDOW} good runs by more "
        f"than {round(HISTORY_MARGIN * 100)}% (judged from {MIN_HISTORY} good runs on)")


def _bad_layers(layers: Mapping[str, str]) -> set[str]:
    return {layer for layer, outcome in layers.items() if outcome in FAILING}


def build_trend(hosts: Mapping[str, dict[str, Any]], previous: Mapping[str, Any], *, source: str | None,
                excluded: Sequence[str], threshold_pct: float,
                history_dir: Path | None = None) -> dict[str, Any]:
    """`excluded`: host names or globs left out on purpose (they did not disappear); `history_dir`: where each
    host's good-runs.json is (the run-to-run spread of its numbers)."""
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
        deltas = perf_deltas(host_numbers(old), host_numbers(entry), threshold_pct,
                             history_numbers(history_dir, name))
        entry["perf_delta"] = deltas
        perf.extend({"host": name, "metric": key, **delta} for key, delta in deltas.items()
                    if delta["significant"])
    perf.sort(key=lambda d: (*_delta_rank(d), d["host"], d["metric"]))
    return {
        "previous": {"source": source, "generated": previous.get("generated"),
                     "finished": _last_finished(previous), "run_ids": previous.get("run_ids", []),
                     "hosts": len(before)},
        "new_failures": new_failures,
        "fixed": fixed,
        "still_failing": still_failing,
        "new_hosts": sorted(set(hosts) - set(before)),
        "disappeared": sorted(name for name in set(before) - set(hosts)
                              if not any(fnmatch.fnmatchcase(name, pattern) for pattern in excluded)),
        "perf_threshold_pct": threshold_pct,
        # where speculation stops paying, moved (fleet/sweeps.py), with the level over the good runs
        "crossover": crossover_changes(hosts, before, None if history_dir is None else
                                       {name: read_good_runs(history_dir, name) for name in hosts}),
        "perf_rule": RULE,
        "perf": perf,
    }


def _last_finished(summary: Mapping[str, Any]) -> str | None:
    """When the newest run of a summary finished (what "since the previous run" means), else when it was
    made."""
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


def changes_since_good(config: pytest.Config) -> dict[str, dict[str, Any] | None]:
    """{failing host of this run: what changed since its last good verdict, or None with none on record},
    from this run's written verdicts and the history folder the fleet summary keeps (--dflash-history,
    default <report dir>/history)."""
    from pytest_dflash.config import options
    from pytest_dflash.fleet.verdicts import HISTORY, History
    from pytest_dflash.run.stash import REPORTED_KEY, RUN_KEY

    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return {}
    history = History(options.path(config, "dflash_history") or run.options.report_dir / HISTORY)
    out: dict[str, dict[str, Any] | None] = {}
    for path in config.stash.get(REPORTED_KEY, []):
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        failed = isinstance(data, dict) and data.get("verdict") == "fail"
        if not failed or not isinstance(data.get("host"), str):
            continue
        good = history.last_good(data["host"])
        out[data["host"]] = what_changed(good, data) if good is not None else None
    return out
