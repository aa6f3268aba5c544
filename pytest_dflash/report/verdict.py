"""Per-host verdicts, built on the controller from test reports (works the same under xdist).

Each test report carries a `("dflash", {...})` user property (host, layer, services, outcome,
diagnoses, service facts). `VerdictBuilder` folds them into one verdict per host:

    layer outcome = failed  if any test of the layer failed (or errored)
                  = blocked if none failed and some were skipped because a lower layer failed
                  = passed  if some passed and none failed/blocked (plain skips are allowed)
                  = skipped if every test was skipped for another reason (e.g. "no GPU")
                  = not-run if no test of the layer was selected

A skip is one of three kinds (run/skips.py): "does not apply" (innocent), "could not check" or "skipped from
outside the profile" (a skip marker or pytest.skip that is not the plugin's); the last two are counted in
`skipped` and in `unchecked`: a layer with one passes no gate, and its host is at best partial.

A host's verdict is computed from what pytest collected, reported, deselected and lost for that host, and
from what happened to the run as a whole — never from which options were given:

    verdict = interrupted  the run was not whole: stopped early (Ctrl-C, SIGTERM, -x/--maxfail), an xdist
                           worker crashed (even when its tests ran again elsewhere), a collection or internal
                           error, a usage error, nothing collected, a test of this host selected at collection
                           that never finished, or the run never wrote its final verdict (killed: the file
                           written at start)
            = fail         a layer failed or was blocked, or a test outside the dflash tests failed (a check
                           xfailed by a marker, or failed before a rerun that passed, is failed)
            = partial      nothing failed, but not everything the run's scope defines ran: tests of this host
                           were deselected (by any means: -k, -m, --lf, --sw, --deselect, a conftest, a
                           plugin), a check its suites define was never collected for it (report/checklist.py:
                           --ignore, -o python_functions, …, by path or --pyargs), the run named node ids, a
                           check of this host could not be made or was skipped from outside the profile, or no
                           test of this host passed at all
            = pass         every check the run's declared scope (report/scope.py: the suites it named) defines
                           for the host ran and passed (or did not apply), and none of the above happened

Every host the run names (--host, --attach, --fleet, this shard's share) gets a verdict, also one with no
report. Exit codes are documented in docs/gating.md; the gate's rule is report/gate.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.layers import LAYERS
from pytest_dflash.config.targets import file_name
from pytest_dflash.files import atomic_write
from pytest_dflash.report import gate as gate_rule
from pytest_dflash.report.gate import gate_line as gate_line  # re-exported: the gate's one line
from pytest_dflash.report.plots import stopped_in
from pytest_dflash.report.ranks import rank_lines
from pytest_dflash.report.scope import Scope
from pytest_dflash.run import skips

SCHEMA = "pytest-dflash/verdict/1"
OUTCOMES = ("passed", "failed", "blocked", "skipped", "not-run")
VERDICTS = ("pass", "fail", "partial", "interrupted")
LOST_SHOWN = 20  # lost test ids listed in a verdict (the count is always exact)
NEVER_FINISHED = ("the run that wrote this file never finished (killed by SIGKILL, an OOM kill, os._exit or "
                  "a pytest-timeout thread kill?): this is the file written when it started")


@dataclass
class LayerTally:
    passed: int = 0
    failed: int = 0
    blocked: int = 0
    skipped: int = 0
    # of the skips, the checks not made: could not check, or skipped from outside the profile (run/skips.py);
    # the outcome ignores them, the host's verdict and a gate do not
    unchecked: int = 0

    @property
    def outcome(self) -> str:
        if self.failed:
            return "failed"
        if self.blocked:
            return "blocked"
        if self.passed:
            return "passed"
        if self.skipped:
            return "skipped"
        return "not-run"


@dataclass
class HostVerdict:
    host: str
    profile: str = ""
    connection: str | None = None
    layers: dict[str, LayerTally] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    blocked: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # e.g. "env": the host's serving-stack snapshot

    def tally(self, layer: str) -> LayerTally:
        return self.layers.setdefault(layer, LayerTally())

    @property
    def verdict(self) -> str:
        """What the tests said about the host: 'fail' if a layer failed or was blocked, else 'pass'."""
        return "fail" if any(t.outcome in ("failed", "blocked") for t in self.layers.values()) else "pass"

    def lost_reason(self, status: RunStatus) -> str | None:
        """This host's own share of an unfinished run: its selected tests that never finished."""
        host = status.hosts.get(self.host)
        if host is None or not host.lost:
            return None
        return (f"{len(host.lost)} of {host.selected} test(s) of this host selected at collection never "
                f"finished (first: {host.lost[0]})")

    def interrupted_reason(self, status: RunStatus) -> str | None:
        """Why this host's run was not whole (the run's reason, then this host's lost tests), or None."""
        reasons = [r for r in (status.interrupted, self.lost_reason(status)) if r]
        return "; ".join(reasons) or None

    def partial_reasons(self, status: RunStatus) -> list[str]:
        """How this host's run fell short of everything, in words (empty: nothing was left out)."""
        reasons = list(status.partial)
        host = status.hosts.get(self.host)
        if host is not None and host.deselected:
            reasons.append(f"{host.deselected} test(s) of this host deselected after collection "
                           f"({host.selected} of {host.selected + host.deselected} ran)")
        if host is not None and (uncollected := host.uncollected_reason()):
            reasons.append(uncollected)
        reasons += self.unchecked_reasons()
        if not any(tally.passed for tally in self.layers.values()):
            reasons.append("no test of this host passed")
        return reasons

    def unchecked_reasons(self, layers: Iterable[str] | None = None) -> list[str]:
        """One line per layer (of `layers`, default all) and kind with checks that were not made (could not
        check; skipped from outside the profile), naming the first."""
        reasons = []
        for layer in LAYERS if layers is None else layers:
            for kind, said in ((skips.UNCHECKED, "could not be made"),
                               (skips.OUTSIDE, "were skipped from outside the profile (a skip marker or "
                                               "pytest.skip that is not pytest-dflash's)")):
                entries = [e for e in self.skipped if e.get("kind") == kind and e["layer"] == layer]
                if entries:
                    first = entries[0]
                    message = first["message"].removeprefix(skips.UNCHECKED_PREFIX)
                    reasons.append(f"{len(entries)} check(s) of the {layer} layer {said} (first: "
                                   f"{first['test']}: {message})")
        return reasons

    def final_verdict(self, status: RunStatus) -> str:
        """The verdict with the run's completeness folded in (see the module docstring)."""
        if self.interrupted_reason(status):
            return "interrupted"
        if self.verdict == "fail" or status.foreign:
            return "fail"
        return "partial" if self.partial_reasons(status) else "pass"

    def layer_outcomes(self) -> dict[str, str]:
        return {layer: self.layers[layer].outcome if layer in self.layers else "not-run" for layer in LAYERS}

    def as_dict(self, *, run_id: str, started: float, finished: float, exit_code: int | None,
                gate: Mapping[str, Any] | None, status: RunStatus | None = None) -> dict[str, Any]:
        status = status or RunStatus()
        interrupted = self.interrupted_reason(status)
        partial = self.partial_reasons(status)
        host = status.hosts.get(self.host) or HostStatus()
        return {
            "schema": SCHEMA,
            "host": self.host,
            "profile": self.profile,
            "connection": self.connection,
            "run_id": run_id,
            "started": _iso(started),
            "finished": _iso(finished),
            "duration_s": round(finished - started, 3),
            "verdict": self.final_verdict(status),
            "tests_verdict": self.verdict,
            "complete": not interrupted and not partial,
            "interrupted": interrupted,
            "partial": partial,
            "foreign": list(status.foreign),
            "tests": {"selected": host.selected, "finished": host.finished, "deselected": host.deselected,
                      "lost": list(host.lost[:LOST_SHOWN]),
                      "uncollected": list(host.uncollected[:LOST_SHOWN])},
            "run": {"hosts": list(status.named_hosts), "shard": status.shard},
            "selection": dict(status.selection),
            "scope": status.scope.as_dict(),
            "exit_code": exit_code,
            "layers": {
                layer: {"outcome": outcome, **(vars(self.layers[layer]) if layer in self.layers else {})}
                for layer, outcome in self.layer_outcomes().items()
            },
            "services": self.services,
            "failures": self.failures,
            "blocked": self.blocked,
            "skipped": self.skipped,
            "metrics": self.metrics,
            "facts": self.facts,
            "notes": self.notes,
            "gate": dict(gate) if gate else None,
        }


@dataclass(frozen=True)
class HostStatus:
    """What pytest did with one host's tests: how many were selected at collection (after every deselection),
    how many of those finished, which never did, how many were deselected, and which checks its suites define
    collection made no test of (report/checklist.py)."""

    selected: int = 0
    finished: int = 0
    deselected: int = 0
    lost: tuple[str, ...] = ()
    uncollected: tuple[str, ...] = ()  # checks its suites define that collection made no test of
    uncollected_why: str = ""
    # the layers the run's scope defines checks of for this host (what collection made, before deselection)
    layers: tuple[str, ...] = ()

    def uncollected_reason(self) -> str | None:
        if not self.uncollected:
            return None
        return (f"{len(self.uncollected)} check(s) of this host were never collected (first: "
                f"{self.uncollected[0]}): {self.uncollected_why}")


@dataclass
class RunStatus:
    """Was the run whole? `interrupted`: why the whole run is not (None: it is); `partial`: how the options
    narrowed the run inside its scope (-k, -m, node ids, …); `scope`: the suites it declared; `foreign`:
    failures no dflash test reported (tests without a dflash fixture); `hosts`: each host's own counts
    (deselected, lost); `named_hosts`: every host the run named before --shard took its share, and
    `shard` that share ("2/8")."""

    interrupted: str | None = None
    partial: tuple[str, ...] = ()
    foreign: tuple[str, ...] = ()
    selection: Mapping[str, Any] = field(default_factory=dict)
    hosts: Mapping[str, HostStatus] = field(default_factory=dict)
    named_hosts: tuple[str, ...] = ()
    shard: str | None = None
    scope: Scope = field(default_factory=Scope)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ts))


@dataclass
class VerdictBuilder:
    run_id: str
    started: float = field(default_factory=time.time)
    hosts: dict[str, HostVerdict] = field(default_factory=dict)
    status: RunStatus = field(default_factory=RunStatus)

    def host(self, name: str) -> HostVerdict:
        return self.hosts.setdefault(name, HostVerdict(name))

    def name_hosts(self, profiles: Mapping[str, Any]) -> None:
        """Every host the run names gets a verdict, also one that no test report will ever mention."""
        for name, profile in profiles.items():
            verdict = self.host(name)
            verdict.profile = verdict.profile or str(getattr(profile, "source", "") or "")
            verdict.connection = verdict.connection or getattr(profile, "display_connection", None)

    def add(self, nodeid: str, when: str, outcome: str, info: Mapping[str, Any], message: str) -> None:
        """Fold one test report (setup/call/teardown phase) into its host's verdict."""
        verdict = self.host(str(info["host"]))
        verdict.profile = str(info.get("profile", verdict.profile))
        verdict.connection = info.get("connection", verdict.connection)
        for service, facts in (info.get("service_facts") or {}).items():
            verdict.services.setdefault(service, {}).update({k: v for k, v in facts.items() if v is not None})
        for note in info.get("notes") or ():
            if note not in verdict.notes:
                verdict.notes.append(note)
        for key, value in (info.get("metrics") or {}).items():
            verdict.metrics[key] = value
        for key, value in (info.get("facts") or {}).items():
            verdict.facts[key] = value
        layer = str(info.get("layer", "service"))
        tally = verdict.tally(layer)
        entry = {"test": nodeid, "layer": layer, "services": info.get("services", []), "message": message,
                 "diagnosis": info.get("diagnosis", [])}
        if info.get("gpus"):  # a host-layer failure of these GPUs only: it blocked the services on them
            entry["gpus"] = info["gpus"]
        if outcome == "failed":
            tally.failed += 1
            # what the test saw, beside its diagnosis (the message): 'ServiceCrashed: service … died …'
            symptom = {"symptom": info["symptom"]} if info.get("symptom") else {}
            verdict.failures.append({**entry, "phase": when, **symptom})
        elif outcome == "skipped" and when in ("setup", "call"):
            if info.get("blocked"):
                tally.blocked += 1
                verdict.blocked.append(entry)
            else:
                kind = skips.kind(message, info.get("skip"))
                tally.skipped += 1
                tally.unchecked += kind != skips.NOT_APPLICABLE
                verdict.skipped.append({**entry, "kind": kind})
        elif outcome == "passed" and when == "call":
            tally.passed += 1

    def gate(self, layers: Iterable[str]) -> dict[str, Any]:
        """--gate LAYERS over every host (report/gate.py has the rule): `passed`, `hosts`, `why` (one line per
        reason it did not pass), `refused`, `outside` and the run's `scope`."""
        return gate_rule.judge(self.hosts, self.status, layers)

    def failing(self) -> bool:
        """Does any host's verdict say something other than pass/partial (what the exit code must reflect)?"""
        return any(v.final_verdict(self.status) in ("fail", "interrupted") for v in self.hosts.values())

    def write(self, directory: Path, *, exit_code: int | None, gate: Mapping[str, Any] | None) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        finished = time.time()
        written = []
        for name, verdict in sorted(self.hosts.items()):
            path = directory / f"{_safe(name)}.verdict.json"
            payload = verdict.as_dict(run_id=self.run_id, started=self.started, finished=finished,
                                      exit_code=exit_code, gate=gate, status=self.status)
            atomic_write(path, json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
            written.append(path)
        return written

    def write_started(self, directory: Path, hosts: Iterable[str], reason: str = NEVER_FINISHED) -> None:
        """Before anything can block or fail: an 'interrupted' verdict per host, replaced at the end. A run
        killed outright (SIGKILL, os._exit), or one ended by a usage error (`reason`), then leaves a verdict
        that says so, never an older passing one."""
        directory.mkdir(parents=True, exist_ok=True)
        status = RunStatus(interrupted=reason, selection=self.status.selection,
                           named_hosts=self.status.named_hosts, shard=self.status.shard)
        for name in hosts:
            payload = HostVerdict(name).as_dict(run_id=self.run_id, started=self.started,
                                                finished=self.started, exit_code=None, gate=None,
                                                status=status)
            atomic_write(directory / f"{_safe(name)}.verdict.json", json.dumps(payload, indent=2) + "\n")


BUILDER_KEY = pytest.StashKey[VerdictBuilder]()


def _safe(name: str) -> str:
    return file_name(name)  # injective: two hosts never share a verdict file (config/targets.py)


def failure_lines(failure: Mapping[str, Any]) -> list[str]:
    """One failure in the terminal's verdict section: the test and its message (the root cause's diagnosis
    where it has one), each diagnosis once with its remedy, root cause first, then what the test saw."""
    message = str(failure["message"])
    lines = [f"    FAILED {failure['test']}: {message}"]
    for diagnosis in failure.get("diagnosis", [])[:3]:
        if not message.startswith(f"[{diagnosis['id']}]"):  # the message is the first one's line already
            lines.append(f"      diagnosis [{diagnosis['id']}]: {diagnosis['title']}")
        if diagnosis.get("remedy"):
            lines.append(f"      remedy: {diagnosis['remedy']}")
    if failure.get("symptom") and failure["symptom"] != message:
        lines.append(f"      symptom: {failure['symptom']}")
    return lines


def summary_lines(builder: VerdictBuilder) -> list[str]:
    """The terminal summary: one block per host, layer -> outcome, with the diagnosis of each failure."""
    lines: list[str] = []
    for name, verdict in sorted(builder.hosts.items()):
        outcomes = verdict.layer_outcomes()
        shown = "  ".join(f"{layer}:{outcome}" for layer, outcome in outcomes.items() if outcome != "not-run")
        final = verdict.final_verdict(builder.status)
        lines.append(f"{name}: {final.upper()}  {shown}")
        if lost := verdict.lost_reason(builder.status):
            lines.append(f"    INTERRUPTED: {lost}")
        if final == "partial":  # under a FAIL or an INTERRUPTED, what did not run is not the news
            lines += [f"    PARTIAL: {why}" for why in verdict.partial_reasons(builder.status)
                      if why not in builder.status.partial]
        for service, facts in sorted(verdict.services.items()):
            parts = [f"algorithm unknown: {facts['algorithm_unknown']}" if facts.get("algorithm_unknown")
                     else f"{facts.get('algorithm', '?')}"]
            if facts.get("version"):
                parts.append(f"sglang {facts['version']}")
            ready = facts.get("ready") or {}
            if isinstance(ready, dict) and ready.get("total_s") is not None:
                parts.append(f"ready in {ready['total_s']:.1f}s")
            elif isinstance(stopped := facts.get("stopped"), dict) and stopped.get("total_s") is not None:
                parts.append(f"never ready: stopped {stopped_in(stopped)} after {stopped['total_s']:.1f}s")
            if facts.get("accept_length") is not None:
                parts.append(f"accept length {facts['accept_length']:.2f}")
            lines.append(f"    {service}: {', '.join(parts)}")
        for failure in verdict.failures:
            lines += failure_lines(failure)
        lines += [f"    RANK {line}" for line in rank_lines(verdict.services)]
        blocked_roots = sorted({b["message"] for b in verdict.blocked})
        for root in blocked_roots:
            count = sum(1 for b in verdict.blocked if b["message"] == root)
            lines.append(f"    BLOCKED {count} test(s): {root}")
        for note in verdict.notes:
            lines.append(f"    note: {note}")
    if builder.status.interrupted:
        lines.append(f"INTERRUPTED: {builder.status.interrupted} — no host can pass this run")
    if scope := builder.status.scope.text():
        lines.append(f"scope: {scope} (a pass is a pass of the checks these define)")
    partial = any(v.final_verdict(builder.status) == "partial" for v in builder.hosts.values())
    for reason in builder.status.partial:
        lines.append(f"PARTIAL: {reason} — a pass here does not make a host green in the fleet view"
                     if partial else f"narrowed: {reason}")
    for problem in builder.status.foreign:
        lines.append(f"OUTSIDE THE DFLASH TESTS: {problem}")
    return lines
