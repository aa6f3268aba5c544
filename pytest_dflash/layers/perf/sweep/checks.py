"""The sweep tests' bodies (suites/perf: test_sweep_within_slo, test_goodput_floor, test_crossover): the
host's sweep (run once, shared), the service's gates of one kind, and a failure whose first line is the
first gate that did not pass (the level and the bound in it), followed by the curve.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pytest_dflash.config.tables.slo import slo_for
from pytest_dflash.layers.perf.sweep.book import SweepBook, curve_lines
from pytest_dflash.load.curve import GateResult, SweepCurve
from pytest_dflash.run import skips
from pytest_dflash.run.handle import ServiceHandle

__all__ = ["GATE_KINDS", "INCONCLUSIVE_SWEEP_HINT", "check_sweep", "junit_properties"]

# which floors each test judges, and how the test names them when none is set
GATE_KINDS = {
    "slo": ("max_concurrency_within_slo", "max_concurrency_within_slo = N"),
    "goodput": ("goodput_at.", "goodput_at = {16 = 5.0}"),
    "crossover": ("crossover_vs_", 'crossover_vs = "none" with speedup_up_to = N'),
}
INCONCLUSIVE_SWEEP_HINT = ("INCONCLUSIVE is not a pass: measure the levels the gate needs (longer: [perf] "
                           "sweep_requests; a bigger [perf] sweep_budget; a sweep that reaches the gate's "
                           "level).")


def _ours(gate: GateResult, kind: str) -> bool:
    prefix = GATE_KINDS[kind][0]
    return gate.key == prefix or gate.key.startswith(prefix)


def junit_properties(curve: SweepCurve, service: str) -> list[tuple[str, float]]:
    """The service's curve as flat JUnit properties, a level each: `dflash.perf.<svc>.sweep.c16.output_tok_s`,
    goodput_req_s, TTFT / TPOT / e2e p99, the speed-ups; measurements only, no thresholds."""
    out: list[tuple[str, float]] = []
    found = curve.service(service)
    for point in found.measured if found is not None else ():
        prefix = f"dflash.perf.{service}.sweep.c{point.concurrency}."
        values = [("output_tok_s", point.output_tok_s.point if point.output_tok_s else None),
                  ("goodput_req_s", point.goodput_req_s.point if point.goodput_req_s else None),
                  *((key, point.latency.get(key)) for key in ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms"))]
        out += [(prefix + name, round(float(v), 4)) for name, v in values if v is not None]
    for speedup in curve.speedups:
        if speedup.service == service:
            out += [(f"dflash.perf.{service}.sweep.c{p.concurrency}.speedup_vs_{speedup.versus}",
                     round(p.ratio.point, 4)) for p in speedup.points if p.ratio is not None]
    return out


def check_sweep(sweeps: SweepBook, handle: ServiceHandle, kind: str, *, node: pytest.Item | None,
                properties: list[tuple[str, float]], lines: list[str]) -> None:
    """Judge the service's `kind` gates ("slo", "goodput", "crossover") on the host's sweep."""
    __tracebackhide__ = True
    profile = handle.host.profile
    if sweeps.plan(handle) is None:
        skips.not_applicable(f"no load sweep for {handle.label}: [perf] sweep in {profile.source} "
                             "(or --perf-sweep 1,4,16)")
    floors = profile.floors.get(handle.name, {})
    if kind in ("slo", "goodput") and not slo_for(profile.slo, handle.name):
        skips.not_applicable(f"no SLOs for {handle.label}: [slo] (or [slo.{handle.name}]) in "
                             f"{profile.source}")
    versus = floors.get("crossover_vs")
    if kind == "crossover" and isinstance(versus, str):
        from pytest_dflash.run.fixtures import ready_or_blocked

        ready_or_blocked(handle.host.service(versus), node, role="the crossover's plain twin")
    record = sweeps.sweep(handle)
    curve = record.curve
    shown = curve_lines(curve)
    properties += [p for p in junit_properties(curve, handle.name) if p not in properties]
    lines += [f"{handle.host.name}: {line}" for line in shown if f"{handle.host.name}: {line}" not in lines]
    gates = [g for g in curve.gates if g.service == handle.name and _ours(g, kind)]
    if not gates:
        skips.not_applicable(f"no {kind} gate for {handle.label} in [floors.{handle.name}] of "
                             f"{profile.source} ({GATE_KINDS[kind][1]}): measured "
                             f"{_summary(curve, handle.name, kind)}")
    failing = [g for g in gates if g.outcome != "pass"]
    if not failing:
        return
    text = [f"{handle.label}: {failing[0].message}"]
    text += [f"  {g.message}" for g in gates if g is not failing[0]]
    text += [f"  {line}" for line in shown]
    if any(g.outcome == "inconclusive" for g in failing):
        text.append(INCONCLUSIVE_SWEEP_HINT)
    pytest.fail("\n".join(text), pytrace=False)


def _summary(curve: SweepCurve, service: str, kind: str) -> str:
    """What the sweep measured for a test without a gate (its skip message)."""
    if kind == "crossover":
        texts = [s.crossover_text or f"no crossover with {s.versus} within the sweep" for s in curve.speedups
                 if s.service == service]
        return "; ".join(texts) or "no plain twin to compare with"
    found = curve.service(service)
    if found is None:
        return "nothing"
    parts: Sequence[str] = [
        f"c{p.concurrency} SLO {p.slo_outcome}" + (f", goodput {p.goodput_req_s.point:.4g} req/s"
                                                  if p.goodput_req_s is not None else "")
        for p in found.measured]
    return "; ".join(parts) or "no level"
