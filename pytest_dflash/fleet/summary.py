"""The fleet summary (schema `pytest-dflash/fleet-summary/1`, docs/fleet.md): many per-host verdicts (one run,
or the shards of one) -> one summary dict with trend and history (:func:`build_summary`).

    verdict files ──verdicts.load_verdicts──▶ [LoadedVerdict] ──build_summary──▶ summary dict
        ──outputs.write_outputs──▶ fleet-summary.json, fleet-summary.html, fleet-junit.xml, fleet.prom

The summary holds, per host, the layer matrix, the failures with their diagnoses, blocked roots, services
(algorithm, version, readiness, accept length), perf numbers and the load sweep (where speculation stops
paying: fleet/sweeps.py); for a failing host, since when it fails and
what changed since its last good verdict. `trend` compares with the previous summary: new failures, fixed
hosts, hosts that disappeared or appeared, perf deltas.

Its parts: verdicts.py (the input and the last-good history), values.py (timestamps, flattened numbers) and
trend.py ("what changed", the trend); outputs.py writes the files from it.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_dflash.config.layers import LAYERS
from pytest_dflash.documents import loads_json
from pytest_dflash.errors import DocumentTooDeep
from pytest_dflash.fleet.sweeps import sweep_entry
from pytest_dflash.fleet.trend import build_trend, what_changed
from pytest_dflash.fleet.values import iso, numbers
from pytest_dflash.fleet.verdicts import FleetInputError, History, LoadedVerdict
from pytest_dflash.report.verdict import SCHEMA as VERDICT_SCHEMA
from pytest_dflash.report.verdict import VERDICTS
from pytest_dflash.scrub.bounds import clip

SUMMARY_SCHEMA = "pytest-dflash/fleet-summary/1"


def read_summary(path: Path) -> dict[str, Any]:
    try:
        data = loads_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetInputError(f"{path}: cannot read previous summary: {exc}") from None
    except DocumentTooDeep as exc:
        raise FleetInputError(f"{path}: not a fleet summary ({exc})") from None
    except json.JSONDecodeError as exc:
        raise FleetInputError(f"{path}: not a fleet summary (not JSON: {exc.msg})") from None
    if (not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA
            or not isinstance(data.get("hosts"), dict)):
        raise FleetInputError(f"{path}: not a fleet summary (expected schema {SUMMARY_SCHEMA!r})")
    if (problem := _summary_problem(data)) is not None:
        raise FleetInputError(f"{path}: not a fleet summary ({problem})")
    return data


# What a merge reads of a previous summary's host entries (trend, failing since, last good), by type.
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "layers": (dict,), "metrics": (dict,), "services": (dict,), "failures": (list,), "verdict": (str,),
    "failing_since": (str, type(None)), "failing_since_ts": (int, float, type(None)),
    "last_good": (dict, type(None)),
}


def _summary_problem(data: Mapping[str, Any]) -> str | None:
    """What in a summary (a damaged or edited --previous) the merge could not read, or None."""
    run_ids = data.get("run_ids", [])
    if not isinstance(run_ids, list) or not all(isinstance(r, str) for r in run_ids):
        return "'run_ids' must be a list of strings"
    if not isinstance(data.get("runs", []), list):
        return "'runs' must be a list"
    for name, entry in data["hosts"].items():
        if not isinstance(entry, dict):
            return f"host {name!r} is {type(entry).__name__}, not an object"
        for key, types in _ENTRY_TYPES.items():
            if key in entry and not isinstance(entry[key], types):
                return f"host {name!r}: {key!r} is {type(entry[key]).__name__}"
        metrics = entry.get("metrics", {}).values()
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in metrics):
            return f"host {name!r}: a metric is not a number"
        if not all(isinstance(v, str) for v in entry.get("layers", {}).values()):
            return f"host {name!r}: a layer's outcome is not a string"
        if not all(isinstance(v, dict) for v in entry.get("services", {}).values()):
            return f"host {name!r}: a service's facts are not an object"
        if not all(isinstance(f, dict) and isinstance(f.get("diagnosis", []), list)
                   for f in entry.get("failures", [])):
            return f"host {name!r}: a failure is not an object with a list of diagnoses"
    return None


# ---- per-host entries --------------------------------------------------------------------------------------


def _service_entry(facts: Mapping[str, Any]) -> dict[str, Any]:
    ready = facts.get("ready")
    ready_s = ready.get("total_s") if isinstance(ready, Mapping) else None
    entry: dict[str, Any] = {"algorithm": facts.get("algorithm"), "version": facts.get("version")}
    if isinstance(ready_s, int | float):
        entry["ready_s"] = round(float(ready_s), 3)
    if isinstance(facts.get("accept_length"), int | float):
        entry["accept_length"] = round(float(facts["accept_length"]), 4)
    if facts.get("url"):
        entry["url"] = facts["url"]
    if isinstance(facts.get("ranks"), list):  # the tensor-parallel ranks that died or stopped
        entry["ranks"] = [dict(r) for r in facts["ranks"] if isinstance(r, Mapping)]
    return entry


def _attached(services: Mapping[str, Any]) -> str:
    """What a host without a connection (its services attached by URL) shows instead of a blank."""
    urls = sorted({str(f["url"]) for f in services.values() if isinstance(f, Mapping) and f.get("url")})
    return "none: attached by URL" + (f" ({', '.join(urls)})" if urls else "")


def _failure_entry(failure: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "test": failure.get("test", ""),
        "layer": failure.get("layer", ""),
        "phase": failure.get("phase", ""),
        "message": clip(str(failure.get("message", "")), 500),
        "diagnosis": [{"id": str(d.get("id", "")), "title": str(d.get("title", "")),
                       "remedy": str(d.get("remedy", "")),
                       **({"subject": str(d["subject"])} if d.get("subject") else {})}
                      for d in failure.get("diagnosis") or [] if isinstance(d, Mapping)],
        **({"symptom": str(failure["symptom"])[:500]} if failure.get("symptom") else {}),
    }


def _blocked_entries(blocked: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    roots: dict[str, dict[str, Any]] = {}
    for entry in blocked:
        message = str(entry.get("message", ""))
        root = roots.setdefault(message, {"message": message, "count": 0, "layers": []})
        root["count"] += 1
        layer = entry.get("layer")
        if layer and layer not in root["layers"]:
            root["layers"].append(layer)
    return list(roots.values())


def host_entry(verdict: LoadedVerdict) -> dict[str, Any]:
    data = verdict.data
    layers = data.get("layers", {})
    outcomes = {layer: str((layers.get(layer) or {}).get("outcome", "not-run")) for layer in LAYERS}
    for layer, body in layers.items():  # a layer this version does not know is still shown
        if layer not in outcomes and isinstance(body, Mapping):
            outcomes[layer] = str(body.get("outcome", "not-run"))
    return {
        "verdict": data["verdict"],
        "run_id": verdict.run_id,
        "started": data.get("started"),
        "finished": data.get("finished"),
        "finished_ts": verdict.finished_ts,
        "duration_s": data.get("duration_s"),
        "exit_code": data.get("exit_code"),
        # a run that was interrupted, narrowed or refused by its own gate never makes this host green
        "interrupted": data.get("interrupted"),
        "partial": [str(p) for p in data.get("partial") or []],
        "gate_refused": [str(r) for r in (data.get("gate") or {}).get("refused") or []],
        "profile": data.get("profile"),
        "connection": data.get("connection") or _attached(data.get("services") or {}),
        "layers": outcomes,
        "failures": [_failure_entry(f) for f in data.get("failures", []) if isinstance(f, Mapping)],
        "blocked": _blocked_entries([b for b in data.get("blocked", []) if isinstance(b, Mapping)]),
        "services": {name: _service_entry(facts)
                     for name, facts in sorted((data.get("services") or {}).items())
                     if isinstance(facts, Mapping)},
        "metrics": numbers(data.get("metrics") or {}),
        # the load sweep, per service: levels, the highest within the SLOs, the crossover per plain twin
        "sweep": sweep_entry(numbers(data.get("metrics") or {})),
        # a multi-GPU host: each GPU, its services and what the host layer found wrong (layers/gpu/host.py)
        "gpu_matrix": dict((data.get("facts") or {}).get("gpu_matrix") or {}),
        "notes": [str(n) for n in data.get("notes", [])][:20],
        "source": str(verdict.path),
        "failing_since": None,
        "failing_since_ts": None,
        "last_good": None,
        "changed": None,
        "perf_delta": {},
    }


# ---- the summary -------------------------------------------------------------------------------------------


def other_shards(verdicts: Sequence[LoadedVerdict]) -> list[str]:
    """The hosts the run named (`run.hosts`: the whole fleet before --shard took its share) that this shard's
    run did not hold: at the end of a shard, they are in another shard, not interrupted."""
    have = {v.host for v in verdicts}
    named = {host for v in verdicts if isinstance(run := v.data.get("run"), Mapping) and run.get("shard")
             for host in run.get("hosts") or () if isinstance(host, str)}
    return sorted(named - have)


def missing_verdicts(verdicts: Sequence[LoadedVerdict], excluded: Sequence[str] = ()) -> list[LoadedVerdict]:
    """A stand-in 'interrupted' verdict for each host a run named (its `run.hosts`: every host of the fleet
    before --shard took its share) that no input has a verdict for: a shard that never uploaded, a runner that
    died before writing anything. A merge of shards with one missing is then never a green fleet."""
    have = {v.host for v in verdicts}
    named: dict[str, str] = {}
    for verdict in verdicts:
        run = verdict.data.get("run")
        if not isinstance(run, Mapping):
            continue
        for host in run.get("hosts") or ():
            if (isinstance(host, str) and host not in have
                    and not any(fnmatch.fnmatchcase(host, pattern) for pattern in excluded)):
                named.setdefault(host,
                                 f"run {verdict.run_id}" + (f", shard {run['shard']}" if run.get("shard")
                                                            else ""))
    return [LoadedVerdict(Path(f"<no verdict for {host}>"), {
        "schema": VERDICT_SCHEMA, "host": host, "verdict": "interrupted", "exit_code": None, "layers": {},
        "interrupted": f"no verdict for this host among the merged inputs (named by {source}): its shard or "
                       "run never wrote one", "failures": [], "blocked": [], "services": {}, "metrics": {},
        "facts": {},
    }) for host, source in sorted(named.items())]


def gate_trusts(entry: Mapping[str, Any]) -> bool:
    """Can a gate count this host's layer outcomes? Not when its run was interrupted, its own gate refused
    (a crashed worker, a collection error), or its shard exited with a code other than 0 / 1 (2-5: the run
    itself did not work: interrupted, internal error, usage error, nothing collected)."""
    return (entry["verdict"] != "interrupted" and not entry.get("gate_refused")
            and entry.get("exit_code") in (0, 1, None))


def gate_layers_of(verdicts: Sequence[LoadedVerdict]) -> list[str]:
    """The --gate layers the runs used. Shards that ran different gates cannot be merged into one gate."""
    seen = {tuple((v.data.get("gate") or {}).get("layers") or ()) for v in verdicts if v.data.get("gate")}
    if len(seen) > 1:
        shown = "; ".join(",".join(layers) or "(none)" for layers in sorted(seen))
        raise FleetInputError(f"the shards disagree on the gate ({shown}): pass --gate to say which one "
                              f"applies")
    return list(next(iter(seen))) if seen else []


def build_summary(verdicts: Sequence[LoadedVerdict], *, previous: Mapping[str, Any] | None = None,
                  previous_source: str | None = None, history: History | None = None,
                  gate_layers: Sequence[str] = (), excluded: Sequence[str] = (),
                  exclude_patterns: Sequence[str] = (), perf_threshold_pct: float = 5.0,
                  one_shard: bool = False, now: float | None = None) -> dict[str, Any]:
    """`excluded`: the hosts left out of the inputs; `exclude_patterns`: the globs that left them out.
    `one_shard`: the summary at the end of one --shard run, whose fleet's other hosts are in other shards:
    listed as `in_another_shard`, not as stand-in 'interrupted' verdicts (those are for a merge that lacks a
    shard)."""
    now = time.time() if now is None else now
    elsewhere = other_shards(verdicts) if one_shard else []
    verdicts = [*verdicts, *missing_verdicts(verdicts, [*excluded, *exclude_patterns, *elsewhere])]
    hosts = {v.host: host_entry(v) for v in sorted(verdicts, key=lambda v: v.host)}
    by_host = {v.host: v for v in verdicts}
    before: Mapping[str, Mapping[str, Any]] = (previous or {}).get("hosts", {})
    for name, entry in hosts.items():
        good = history.last_good(name) if history is not None else None
        if entry["verdict"] == "pass":
            entry["last_good"] = {"run_id": entry["run_id"], "finished": entry["finished"],
                                  "finished_ts": entry["finished_ts"]}
            continue
        if good is not None:
            entry["changed"] = what_changed(good, by_host[name].data)
            entry["last_good"] = entry["changed"]["since"]
        old = before.get(name) or {}
        if old.get("verdict") == "fail" and old.get("failing_since"):
            entry["failing_since"], entry["failing_since_ts"] = (old["failing_since"],
                                                                 old.get("failing_since_ts"))
        else:
            entry["failing_since"], entry["failing_since_ts"] = entry["finished"], entry["finished_ts"]
        if entry["last_good"] is None and old.get("last_good"):
            entry["last_good"] = old["last_good"]
    trend = (build_trend(hosts, previous, source=previous_source, excluded=[*excluded, *exclude_patterns],
                         threshold_pct=perf_threshold_pct,
                         history_dir=history.root if history is not None else None)
             if previous is not None else None)
    layer_totals = {layer: {o: 0 for o in ("passed", "failed", "blocked", "skipped", "not-run")}
                    for layer in LAYERS}
    diagnoses: dict[str, dict[str, Any]] = {}
    for name, entry in hosts.items():
        for layer, outcome in entry["layers"].items():
            layer_totals.setdefault(layer, {}).setdefault(outcome, 0)
            layer_totals[layer][outcome] += 1
        for failure in entry["failures"]:
            for diagnosis in failure["diagnosis"]:
                item = diagnoses.setdefault(diagnosis["id"], {"title": diagnosis["title"], "hosts": []})
                if name not in item["hosts"]:
                    item["hosts"].append(name)
    gate = None
    if gate_layers:
        failing = {name: {layer: entry["layers"].get(layer, "not-run") for layer in gate_layers}
                   for name, entry in hosts.items()
                   if any(entry["layers"].get(layer, "not-run") != "passed" for layer in gate_layers)
                   or not gate_trusts(entry)}
        gate = {"layers": list(gate_layers), "passed": bool(hosts) and not failing, "hosts": len(hosts),
                "failing": failing}
    runs: dict[str, dict[str, Any]] = {}
    for verdict in verdicts:
        run = runs.setdefault(verdict.run_id, {"run_id": verdict.run_id, "hosts": 0,
                                               "started": verdict.data.get("started"),
                                               "finished": verdict.data.get("finished")})
        run["hosts"] += 1
    counts = {verdict: sum(1 for e in hosts.values() if e["verdict"] == verdict) for verdict in VERDICTS}
    return {
        "schema": SUMMARY_SCHEMA,
        "generated": iso(now),
        "generated_ts": round(now, 3),
        "run_ids": sorted(runs),
        "runs": [runs[r] for r in sorted(runs)],
        "layers": list(LAYERS),
        "totals": {"hosts": len(hosts), **counts, "layers": layer_totals},
        "diagnoses": dict(sorted(diagnoses.items(), key=lambda kv: (-len(kv[1]["hosts"]), kv[0]))),
        "gate": gate,
        "excluded": list(excluded),
        "in_another_shard": elsewhere,
        "trend": trend,
        "hosts": hosts,
    }
