"""--gate LAYERS: the rule, its reasons and its one line.

The rule (docs/gating.md, "--gate LAYERS"): a gate over layers L passes only if the run was whole (nothing
interrupted, no failure outside the dflash tests) and, on every host the run names, each layer of L ran
every check the run's declared scope (report/scope.py) defines for it and all of them passed: a check that
failed, was blocked, could not be made or was skipped from outside the profile, was deselected, never
collected or never finished fails it; a layer the scope defines no check of fails it as "not in scope".
Skips that do not apply (a plain service has no speculation) are allowed beside a pass. Every reason the
gate did not pass is one line of `why`, printed under the gate line and kept in the verdict's `gate`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from pytest_dflash.report.scope import Scope

SHOWN = 10  # hosts and outside failures named in the one line (the JSON lists them all)


# What the gate reads of report/verdict.py's HostVerdict, HostStatus and RunStatus (which build the gate: a
# Protocol here, not an import back up)
class HostVerdict(Protocol):
    host: str
    failures: list[dict[str, Any]]
    blocked: list[dict[str, Any]]
    skipped: list[dict[str, Any]]

    def layer_outcomes(self) -> dict[str, str]: ...

    def unchecked_reasons(self, layers: Iterable[str] | None = None) -> list[str]: ...


class HostStatus(Protocol):
    @property
    def lost(self) -> tuple[str, ...]: ...

    @property
    def deselected(self) -> int: ...

    @property
    def layers(self) -> tuple[str, ...]: ...

    def uncollected_reason(self) -> str | None: ...


class RunStatus(Protocol):
    interrupted: str | None
    partial: tuple[str, ...]
    foreign: tuple[str, ...]
    scope: Scope

    @property
    def hosts(self) -> Mapping[str, HostStatus]: ...


def judge(hosts: Mapping[str, HostVerdict], status: RunStatus, layers: Iterable[str]) -> dict[str, Any]:
    """The gate over `layers`: passed, each host's outcome of each gated layer, why it did not pass (`why`:
    one line per gated layer that did not pass on a host, then `refused`: what of the run itself refuses any
    gate), and the failed layers outside it."""
    wanted = list(layers)
    per_host = {name: {layer: v.layer_outcomes()[layer] for layer in wanted}
                for name, v in sorted(hosts.items())}
    refused = [f"the run was interrupted: {status.interrupted}"] if status.interrupted else []
    refused += [f"outside the dflash tests: {problem}" for problem in status.foreign]
    refused += [f"the run was narrowed: {why}" for why in status.partial]
    for name, host in sorted(status.hosts.items()):
        if host.lost:
            refused.append(f"{name}: {len(host.lost)} selected test(s) never finished (first: "
                           f"{host.lost[0]})")
        if host.deselected:
            refused.append(f"{name}: {host.deselected} test(s) deselected after collection")
        if uncollected := host.uncollected_reason():
            refused.append(f"{name}: {uncollected.replace('of this host ', '')}")
    for name, verdict in sorted(hosts.items()):
        refused += [f"{name}: {why}" for why in verdict.unchecked_reasons(wanted)]
    why = [f"failed: {name} {layer}: {layer_reason(hosts[name], status, layer, outcome)}"
           for name, outcomes in per_host.items() for layer, outcome in outcomes.items()
           if outcome != "passed"]
    if not per_host:
        why.append("failed: no host was tested")
    why += [f"refused: {reason}" for reason in refused]
    # what the gate does not judge but a reader must not miss: a failed layer outside it (a blocked one is the
    # echo of a failure, listed here or failing the gate)
    outside = [f"{name} {layer} failed" for name, v in sorted(hosts.items())
               for layer, outcome in v.layer_outcomes().items()
               if layer not in wanted and outcome == "failed"]
    return {"layers": wanted, "passed": not why, "hosts": per_host, "refused": refused, "outside": outside,
            "why": why, "scope": status.scope.as_dict()}


def layer_reason(verdict: HostVerdict, status: RunStatus, layer: str, outcome: str) -> str:
    """Why one gated layer of one host did not pass, in one line."""
    if outcome == "failed":
        failed = [f for f in verdict.failures if f.get("layer") == layer]
        first = failed[0] if failed else {"test": "?", "message": ""}
        return f"{len(failed)} check(s) failed (first: {first['test']}: {first['message']})"
    if outcome == "blocked":
        blocked = [b for b in verdict.blocked if b.get("layer") == layer]
        first = blocked[0] if blocked else {"message": "blocked"}
        return f"{len(blocked)} check(s) {first['message']}"
    if outcome == "skipped":
        skipped = [s for s in verdict.skipped if s.get("layer") == layer]
        first = skipped[0] if skipped else {"test": "?", "message": "", "kind": "?"}
        return (f"every check was skipped, none passed (first: {first['test']}: {first.get('kind')}: "
                f"{first['message']})")
    host = status.hosts.get(verdict.host)
    if host is not None and host.layers and layer not in host.layers:
        scope = status.scope.text() or "the run's tests"
        return f"not in scope: {scope} define(s) no check of the {layer} layer"
    return "no check of it ran (deselected, never collected or never finished)"


def gate_line(gate: Mapping[str, Any]) -> str:
    """The gate's one line: 'gate service,generation: PASSED; scope: smoke (1 of 8 suites); outside the gate:
    randdraft perf failed'."""
    failing = sorted(host for host, outcomes in (gate.get("hosts") or {}).items()
                     if any(outcome != "passed" for outcome in outcomes.values()))
    on = f" on {', '.join(failing[:SHOWN])}" if failing else ""
    verdict = "PASSED" if gate["passed"] else f"FAILED{on}"
    line = f"gate {','.join(gate['layers'])}: {verdict}{' …' if len(failing) > SHOWN else ''}"
    scope = gate.get("scope") or {}
    if scope.get("text") and not scope.get("whole"):  # a chosen part: some suites, or a folder of its own
        line += f"; scope: {scope['text']}"
    outside = list(gate.get("outside") or ())
    if outside:
        line += f"; outside the gate: {', '.join(outside[:SHOWN])}{' …' if len(outside) > SHOWN else ''}"
    return line


def why_lines(gate: Mapping[str, Any]) -> list[str]:
    """The lines under the gate line: '  gate failed: HOST LAYER: why' and '  gate refused: why'."""
    why = gate.get("why")
    if why is None:  # a gate recorded before `why` existed
        why = [f"refused: {reason}" for reason in gate.get("refused") or ()]
    return [f"  gate {line}" for line in why]
