"""Fleet summary: many per-host verdicts (one run, or the shards of one) -> one summary with trend and history.

    verdict files ──load_verdicts──▶ [LoadedVerdict] ──build_summary──▶ summary dict ──write_outputs──▶
        fleet-summary.json, fleet-summary.html, fleet-junit.xml, fleet.prom   (+ history/<host>/last-good…)

The summary (schema `pytest-dflash/fleet-summary/1`, docs/fleet.md) holds, per host, the layer matrix, the
failures with their diagnoses, blocked roots, services (algorithm, version, readiness, accept length) and perf
numbers; for a failing host, since when it fails and what changed since its last good verdict. `trend` compares
with the previous summary: new failures, fixed hosts, hosts that disappeared or appeared, perf deltas.

Used by `pytest-dflash merge` (pytest_dflash.cli) and at the end of every run (pytest_dflash.fleet.hooks).
Its parts: values.py (timestamps, flattened numbers) and trend.py ("what changed", the trend).
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_dflash.config.layers import LAYERS
from pytest_dflash.fleet.trend import (
    build_trend,
    record_good_runs,
    trend_line,
    what_changed,
)
from pytest_dflash.fleet.values import iso, numbers, parse_time
from pytest_dflash.report.files import atomic_write
from pytest_dflash.report.verdict import SCHEMA as VERDICT_SCHEMA
from pytest_dflash.report.verdict import VERDICTS, LayerTally

SUMMARY_SCHEMA = "pytest-dflash/fleet-summary/1"
SUMMARY_JSON = "fleet-summary.json"
SUMMARY_HTML = "fleet-summary.html"
JUNIT_XML = "fleet-junit.xml"
PROMETHEUS = "fleet.prom"
HISTORY = "history"
LAST_GOOD = "last-good.verdict.json"
VERDICT_GLOB = "*.verdict.json"


class FleetInputError(Exception):
    """Bad input to a merge: one line, naming the file and what is wrong."""


@dataclass(frozen=True)
class LoadedVerdict:
    path: Path
    data: dict[str, Any]

    @property
    def host(self) -> str:
        return str(self.data["host"])

    @property
    def run_id(self) -> str:
        return str(self.data.get("run_id") or "")

    @property
    def finished_ts(self) -> float | None:
        return parse_time(self.data.get("finished"))

    @property
    def passed(self) -> bool:
        return self.data.get("verdict") == "pass"


# ---- input ----------------------------------------------------------------------------------------------


def find_verdict_files(inputs: Iterable[str | Path]) -> list[Path]:
    """Every verdict file named by the inputs: a file, or a folder searched recursively (shard artifacts are
    often one sub-folder each) for *.verdict.json, skipping history/ folders (last-good copies)."""
    files: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob(VERDICT_GLOB)
                           if p.is_file() and HISTORY not in p.relative_to(path).parts[:-1])
            if not found:
                raise FleetInputError(f"{path}: no {VERDICT_GLOB} files in this folder")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FleetInputError(f"{path}: no such file or folder")
    return files


def read_verdict(path: Path) -> dict[str, Any]:
    """One verdict file, checked enough that a summary can be built from it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetInputError(f"{path}: cannot read: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FleetInputError(
            f"{path}: not a pytest-dflash verdict (not JSON: {exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != VERDICT_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise FleetInputError(f"{path}: not a pytest-dflash verdict (schema {found!r}, expected {VERDICT_SCHEMA!r})")
    problems = []
    if not isinstance(data.get("host"), str) or not data["host"]:
        problems.append("'host' must be a non-empty string")
    if data.get("verdict") not in VERDICTS:
        problems.append(f"'verdict' must be one of {', '.join(VERDICTS)}")
    if not isinstance(data.get("layers"), dict):
        problems.append("'layers' must be an object")
    for key in ("failures", "blocked"):
        if not isinstance(data.get(key, []), list):
            problems.append(f"'{key}' must be a list")
    for key in ("services", "metrics", "facts"):
        if not isinstance(data.get(key) or {}, dict):
            problems.append(f"'{key}' must be an object")
    if problems:
        raise FleetInputError(f"{path}: invalid verdict: {problems[0]}")
    if (why := inconsistency(data)) is not None:
        raise FleetInputError(f"{path}: inconsistent verdict, refused: {why}")
    return data


_TALLY_KEYS = ("passed", "failed", "blocked", "skipped")


def inconsistency(data: Mapping[str, Any]) -> str | None:
    """Why a verdict file contradicts itself (None: it does not). A merge trusts no 'pass' that its own layers,
    failures, completeness or exit code deny: such a file was edited, damaged or written by a broken tool."""
    verdict = data["verdict"]
    outcomes: dict[str, str] = {}
    for layer, body in data["layers"].items():
        if not isinstance(body, Mapping):
            return f"layer {layer!r} is not an object"
        outcome = str(body.get("outcome", "not-run"))
        counts = {key: body[key] for key in _TALLY_KEYS if key in body}
        if counts and all(isinstance(v, int) for v in counts.values()):
            tally = LayerTally(**counts)
            if tally.outcome != outcome:
                return f"layer {layer!r} says {outcome!r} but its counts {counts} make it {tally.outcome!r}"
        outcomes[layer] = outcome
    bad_layers = [layer for layer, outcome in outcomes.items() if outcome in ("failed", "blocked")]
    interrupted, partial = data.get("interrupted"), data.get("partial") or []
    failures, blocked, foreign = data.get("failures") or [], data.get("blocked") or [], data.get("foreign") or []
    exit_code = data.get("exit_code")
    if bool(interrupted) != (verdict == "interrupted"):
        return f"'verdict' is {verdict!r} but 'interrupted' is {interrupted!r}"
    if exit_code is None and verdict != "interrupted":
        return f"'verdict' is {verdict!r} but 'exit_code' is null (a run that never finished)"
    if "complete" in data and data["complete"] != (not interrupted and not partial):
        return f"'complete' is {data['complete']!r} but 'interrupted' is {interrupted!r} and 'partial' {partial!r}"
    if verdict == "pass":
        if bad_layers:
            return f"'verdict' is 'pass' but layer {bad_layers[0]!r} {outcomes[bad_layers[0]]}"
        if failures or blocked or foreign:
            return "'verdict' is 'pass' but it lists failed or blocked tests"
        if partial:
            return f"'verdict' is 'pass' but 'partial' says {partial[0]!r}"
        if data.get("tests_verdict", "pass") != "pass":
            return f"'verdict' is 'pass' but 'tests_verdict' is {data.get('tests_verdict')!r}"
        if exit_code not in (0, 1):
            return f"'verdict' is 'pass' but the run exited {exit_code!r} (0, or 1 for another host's failure)"
    elif verdict == "fail":
        if not (bad_layers or failures or blocked or foreign):
            return "'verdict' is 'fail' but no layer failed or was blocked and no test failed"
        gate = data.get("gate") or {}
        if exit_code == 0 and not gate.get("passed"):
            return "'verdict' is 'fail' but the run exited 0 without a gate that passed"
    elif verdict == "partial":
        if not partial:
            return "'verdict' is 'partial' but 'partial' gives no reason"
        if bad_layers or failures or blocked:
            return "'verdict' is 'partial' but a layer failed or was blocked"
    elif exit_code == 0:
        return "'verdict' is 'interrupted' but the run exited 0"
    return None


def load_verdicts(inputs: Iterable[str | Path], *, latest: bool = False,
                  exclude: Sequence[str] = ()) -> tuple[list[LoadedVerdict], list[str]]:
    """(verdicts, excluded host names). Two files for one host are one verdict when their content is the same
    (the same artifact downloaded twice); otherwise an error, or with `latest` the one that finished last."""
    by_host: dict[str, LoadedVerdict] = {}
    excluded: set[str] = set()
    for path in find_verdict_files(inputs):
        loaded = LoadedVerdict(path, read_verdict(path))
        if any(fnmatch.fnmatchcase(loaded.host, pattern) for pattern in exclude):
            excluded.add(loaded.host)
            continue
        other = by_host.get(loaded.host)
        if other is None or other.data == loaded.data:
            by_host.setdefault(loaded.host, loaded)
            continue
        newer = _newer(other, loaded)
        if not latest or newer is None:
            raise FleetInputError(
                f"conflicting verdicts for host {loaded.host!r}: {other.path} (run {other.run_id}, finished "
                f"{other.data.get('finished')}) and {loaded.path} (run {loaded.run_id}, finished "
                f"{loaded.data.get('finished')})" + ("" if latest else "; pass --latest to keep the newer one"))
        by_host[loaded.host] = newer
    return [by_host[name] for name in sorted(by_host)], sorted(excluded)


def _newer(a: LoadedVerdict, b: LoadedVerdict) -> LoadedVerdict | None:
    ta, tb = a.finished_ts, b.finished_ts
    if ta is None or tb is None or ta == tb:
        return None
    return a if ta > tb else b


def read_summary(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetInputError(f"{path}: cannot read previous summary: {exc}") from None
    except json.JSONDecodeError as exc:
        raise FleetInputError(f"{path}: not a fleet summary (not JSON: {exc.msg})") from None
    if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA or not isinstance(data.get("hosts"), dict):
        raise FleetInputError(f"{path}: not a fleet summary (expected schema {SUMMARY_SCHEMA!r})")
    return data


# ---- history: the last good verdict of every host ---------------------------------------------------------


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class History:
    """`<root>/<host>/last-good.verdict.json`: a copy of the newest passing verdict of each host."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, host: str) -> Path:
        return self.root / safe_name(host) / LAST_GOOD

    def last_good(self, host: str) -> dict[str, Any] | None:
        path = self.path(host)
        if not path.is_file():
            return None
        try:
            data = read_verdict(path)
        except FleetInputError:
            return None  # a damaged copy is as good as none; the next passing run replaces it
        return data if data.get("host") == host and data.get("verdict") == "pass" else None

    def record(self, verdicts: Iterable[LoadedVerdict]) -> list[Path]:
        """Store the passing verdicts that are newer than the host's stored one; returns the paths written."""
        written = []
        for verdict in verdicts:
            if not verdict.passed:
                continue
            path = self.path(verdict.host)
            current = self.last_good(verdict.host)
            if current is not None:
                if current.get("run_id") == verdict.run_id and current.get("finished") == verdict.data.get("finished"):
                    continue
                stored = parse_time(current.get("finished"))
                if stored is not None and (verdict.finished_ts or 0.0) < stored:
                    continue  # an older artifact merged late never replaces a newer good verdict
            atomic_write(path, json.dumps(verdict.data, indent=1, default=str) + "\n", sync=False)
            written.append(path)
        return written


# ---- per-host entries ---------------------------------------------------------------------------------------


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
    return entry


def _failure_entry(failure: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "test": failure.get("test", ""),
        "layer": failure.get("layer", ""),
        "phase": failure.get("phase", ""),
        "message": str(failure.get("message", ""))[:500],
        "diagnosis": [{"id": str(d.get("id", "")), "title": str(d.get("title", "")),
                       "remedy": str(d.get("remedy", ""))}
                      for d in failure.get("diagnosis") or [] if isinstance(d, Mapping)],
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
        "connection": data.get("connection"),
        "layers": outcomes,
        "failures": [_failure_entry(f) for f in data.get("failures", []) if isinstance(f, Mapping)],
        "blocked": _blocked_entries([b for b in data.get("blocked", []) if isinstance(b, Mapping)]),
        "services": {name: _service_entry(facts) for name, facts in sorted((data.get("services") or {}).items())
                     if isinstance(facts, Mapping)},
        "metrics": numbers(data.get("metrics") or {}),
        "notes": [str(n) for n in data.get("notes", [])][:20],
        "source": str(verdict.path),
        "failing_since": None,
        "failing_since_ts": None,
        "last_good": None,
        "changed": None,
        "perf_delta": {},
    }


# ---- the summary ---------------------------------------------------------------------------------------------


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
                named.setdefault(host, f"run {verdict.run_id}" + (f", shard {run['shard']}" if run.get("shard")
                                                                  else ""))
    return [LoadedVerdict(Path(f"<no verdict for {host}>"), {
        "schema": VERDICT_SCHEMA, "host": host, "verdict": "interrupted", "exit_code": None, "layers": {},
        "interrupted": f"no verdict for this host among the merged inputs (named by {source}): its shard or run "
                       "never wrote one", "failures": [], "blocked": [], "services": {}, "metrics": {}, "facts": {},
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
        raise FleetInputError(f"the shards disagree on the gate ({shown}): pass --gate to say which one applies")
    return list(next(iter(seen))) if seen else []


def build_summary(verdicts: Sequence[LoadedVerdict], *, previous: Mapping[str, Any] | None = None,
                  previous_source: str | None = None, history: History | None = None,
                  gate_layers: Sequence[str] = (), excluded: Sequence[str] = (), exclude_patterns: Sequence[str] = (),
                  perf_threshold_pct: float = 5.0, now: float | None = None) -> dict[str, Any]:
    """`excluded`: the hosts left out of the inputs; `exclude_patterns`: the globs that left them out."""
    now = time.time() if now is None else now
    verdicts = [*verdicts, *missing_verdicts(verdicts, [*excluded, *exclude_patterns])]
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
            entry["failing_since"], entry["failing_since_ts"] = old["failing_since"], old.get("failing_since_ts")
        else:
            entry["failing_since"], entry["failing_since_ts"] = entry["finished"], entry["finished_ts"]
        if entry["last_good"] is None and old.get("last_good"):
            entry["last_good"] = old["last_good"]
    trend = (build_trend(hosts, previous, source=previous_source, excluded=[*excluded, *exclude_patterns],
                         threshold_pct=perf_threshold_pct, history_dir=history.root if history is not None else None)
             if previous is not None else None)
    layer_totals = {layer: {o: 0 for o in ("passed", "failed", "blocked", "skipped", "not-run")} for layer in LAYERS}
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
        "trend": trend,
        "hosts": hosts,
    }


@dataclass
class Outputs:
    summary_json: Path
    summary_html: Path
    junit_xml: Path
    prometheus: list[Path]
    history: list[Path]

    def all(self) -> list[Path]:
        return [self.summary_json, self.summary_html, self.junit_xml, *self.prometheus]


def write_outputs(summary: Mapping[str, Any], out_dir: Path, *, prometheus: Path | None = None) -> Outputs:
    from pytest_dflash.fleet.html import render_html
    from pytest_dflash.fleet.junit import render_junit
    from pytest_dflash.fleet.prometheus import fleet_exposition, write_textfile

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = Outputs(out_dir / SUMMARY_JSON, out_dir / SUMMARY_HTML, out_dir / JUNIT_XML, [out_dir / PROMETHEUS], [])
    atomic_write(paths.summary_json, json.dumps(summary, indent=1, default=str) + "\n")
    atomic_write(paths.summary_html, render_html(summary))
    atomic_write(paths.junit_xml, render_junit(summary))
    text = fleet_exposition(summary)
    write_textfile(paths.prometheus[0], text)
    if prometheus is not None and prometheus.resolve() != paths.prometheus[0].resolve():
        write_textfile(prometheus, text)
        paths.prometheus.append(prometheus)
    return paths


def summarize(inputs: Sequence[LoadedVerdict], out_dir: Path, *, previous_path: Path | None,
              history_dir: Path | None, gate_layers: Sequence[str] = (), excluded: Sequence[str] = (),
              exclude_patterns: Sequence[str] = (), prometheus: Path | None = None,
              perf_threshold_pct: float = 5.0) -> tuple[dict[str, Any], Outputs]:
    """Build the summary, write every output, then record this run's good verdicts in the history."""
    previous = read_summary(previous_path) if previous_path is not None else None
    history = History(history_dir) if history_dir is not None else None
    summary = build_summary(inputs, previous=previous, previous_source=str(previous_path) if previous_path else None,
                            history=history, gate_layers=gate_layers, excluded=excluded,
                            exclude_patterns=exclude_patterns, perf_threshold_pct=perf_threshold_pct)
    outputs = write_outputs(summary, out_dir, prometheus=prometheus)
    if history is not None:
        outputs.history = history.record(inputs)
        outputs.history += record_good_runs(history.root, summary["hosts"])
    return summary, outputs


def headline(summary: Mapping[str, Any]) -> list[str]:
    """A few lines for a terminal: totals, gate, trend, and what changed on failing hosts."""
    totals = summary["totals"]
    incomplete = [f"{totals[v]} {v}" for v in ("partial", "interrupted") if totals.get(v)]
    lines = [f"fleet: {totals['pass']}/{totals['hosts']} hosts pass"
             + (f" ({', '.join(incomplete)})" if incomplete else "")
             + (f"; excluded: {', '.join(summary['excluded'])}" if summary.get("excluded") else "")]
    gate = summary.get("gate")
    if gate:
        verdict = "PASSED" if gate["passed"] else f"FAILED on {', '.join(sorted(gate['failing'])) or 'no hosts'}"
        lines.append(f"gate {','.join(gate['layers'])}: {verdict}")
    trend = summary.get("trend")
    if trend:
        previous = trend["previous"].get("finished") or "the previous run"
        if trend["new_failures"]:
            lines.append(f"new failures since {previous}: " + "; ".join(
                f"{f['host']} ({', '.join(f['layers'])}{': ' + ', '.join(f['diagnosis']) if f['diagnosis'] else ''})"
                for f in trend["new_failures"][:10]) + (" …" if len(trend["new_failures"]) > 10 else ""))
        if trend["fixed"]:
            lines.append("fixed: " + ", ".join(f["host"] for f in trend["fixed"][:20]))
        if trend["disappeared"]:
            lines.append("disappeared (no verdict this time): " + ", ".join(trend["disappeared"][:20]))
        regressions = [p for p in trend["perf"] if p["regression"]]
        if regressions:
            lines.append("perf regressions: " + "; ".join(trend_line(p) for p in regressions[:5]))
    shown = 0
    for name, entry in summary["hosts"].items():
        if entry["verdict"] != "fail" or shown >= 10:
            continue
        shown += 1
        changed = entry.get("changed")
        since = f"failing since {entry['failing_since']}"
        if changed is None:
            lines.append(f"{name}: {since}; no good verdict on record to compare with")
        elif not changed["count"]:
            lines.append(f"{name}: {since}; nothing changed since its last good run {changed['since']['run_id']}")
        else:
            parts = [f"{c['key'].rsplit('.', 1)[-1]} {_short(c['before'])} -> {_short(c['after'])}"
                     for c in changed["changes"][:4]]
            more = f" (+{changed['count'] - 4} more)" if changed["count"] > 4 else ""
            lines.append(f"{name}: {since}; changed since last good run {changed['since']['run_id']}: "
                         + "; ".join(parts) + more)
    return lines


def _short(value: Any) -> str:
    text = "absent" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "…"
