"""The sweeps of this process: one per host, run by the first sweep test of the host (every service of the
host, interleaved, run.py) and shared by the others; its gates judged, its curve written to
`<report dir>/perf/<host>/sweep.json` and its numbers published into the host's verdict.

Built by the perf layer's book (`PerfBook.sweeps`) with the book's own ways to load a service, so a level is
loaded exactly as the perf layer loads a service (endpoint, lengths, headers, the saturated-client retry).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from pytest_dflash.config.tables.slo import slo_for
from pytest_dflash.errors import DflashError
from pytest_dflash.layers.perf.judging import confidence_of
from pytest_dflash.layers.perf.service_run import ServiceRun, write_json
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.layers.perf.sweep.build import comparison_pairs
from pytest_dflash.layers.perf.sweep.gates import judge_gates
from pytest_dflash.layers.perf.sweep.plan import SweepPlan
from pytest_dflash.layers.perf.sweep.run import SweepRecord, SweepService, run_sweep
from pytest_dflash.load.curve import GateResult, Interval, SweepCurve
from pytest_dflash.load.results import LoadResult
from pytest_dflash.run.handle import HandleHost, ServiceHandle
from pytest_dflash.scrub.redact import one_line

__all__ = ["SweepBook", "curve_lines", "sweep_metrics"]

Loader = Callable[[ServiceHandle, PerfSettings], ServiceRun]


class SweepBook:
    """One sweep per host, shared by every sweep test of the host."""

    def __init__(self, *, load: Loader, settings: Callable[[ServiceHandle], PerfSettings],
                 report_dir: Callable[[], Path], levels: tuple[int, ...] | None = None) -> None:
        self._load, self._settings, self._report_dir = load, settings, report_dir
        self.levels = levels  # --perf-sweep
        self.records: dict[str, SweepRecord] = {}

    def plan(self, handle: ServiceHandle) -> SweepPlan | None:
        return SweepPlan.resolve(handle.host.profile.perf, self.levels)

    def sweep(self, handle: ServiceHandle) -> SweepRecord:
        """The host's sweep (run now by the first test that needs it)."""
        host = handle.host
        if host.name in self.records:
            return self.records[host.name]
        plan = self.plan(handle)
        assert plan is not None, "sweep() without a sweep: check plan() first"
        profile = host.profile
        progress = host.run.progress
        progress(f"{host.name}: load sweep ({plan.describe()}; every service at each level, interleaved)")
        services = [self._service(host, name, plan) for name in profile.services]
        algorithms = {s.name: s.algorithm for s in services}
        pairs = comparison_pairs(algorithms)
        for name, floors in profile.floors.items():
            versus = floors.get("crossover_vs")
            if isinstance(versus, str) and (name, versus) not in pairs:
                pairs.append((name, versus))
        first = self._settings(handle)
        load = {"endpoint": first.endpoint_for(handle.native), "prompt_len": first.prompt_len,
                "output_len": first.output_len, "dataset": first.dataset, "temperature": first.temperature,
                "requests_per_level": {str(lvl): plan.requests_at(lvl) for lvl in plan.levels}}
        record = run_sweep(host.name, plan, services, pairs=pairs, load=load, say=progress)
        results = judge_gates_of(record, profile.floors)
        gates = tuple(g for per in results.values() for group in per.values() for g in group)
        record.curve = dataclasses.replace(record.curve, gates=gates,
                                           slo=dict(profile.slo.get("default", {})))
        self.records[host.name] = record
        for line in curve_lines(record.curve):
            progress(f"{host.name}: {line}")
        write_json(self.path(host.name), record.curve.to_dict())
        host.facts.metrics.update(sweep_metrics(record.curve))
        return record

    def path(self, host: str) -> Path:
        from pytest_dflash.config.targets import file_name

        return self._report_dir() / "perf" / file_name(host) / "sweep.json"

    def _service(self, host: HandleHost, name: str, plan: SweepPlan) -> SweepService:
        other = host.service(name)
        unavailable = None
        try:
            other.ensure_ready()
        except DflashError as exc:
            unavailable = f"{name} is not ready ({one_line(str(exc))[:200]})"
        base = self._settings(other)

        def measure(level: int) -> LoadResult:
            run = self._load(other, plan.settings_at(base, level))
            host.run.progress(f"{host.name}/{name} at concurrency {level}: {run.headline()}")
            return run.result

        return SweepService(name=name, algorithm=other.algorithm, measure=measure,
                            objectives=slo_for(host.profile.slo, name), unavailable=unavailable)


def judge_gates_of(record: SweepRecord, floors: Mapping[str, Mapping[str, float | str]]
                   ) -> dict[str, dict[str, list[GateResult]]]:
    """Every service's sweep gates ({service: {"slo" | "goodput" | "crossover": [GateResult]}})."""
    out: dict[str, dict[str, list[GateResult]]] = {}
    for service in record.curve.services:
        table = floors.get(service.service, {})
        out[service.service] = judge_gates(record, service.service, table, confidence=confidence_of(table))
    return out


def _g(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


def curve_lines(curve: SweepCurve) -> list[str]:
    """The curve in a few human lines: a line per service (every level), a line per speed-up."""
    lines = []
    for service in curve.services:
        parts = []
        for point in service.levels:
            if not point.measured:
                parts.append(f"c{point.concurrency} {point.why}")
                continue
            tok = point.output_tok_s
            text = f"c{point.concurrency} {_g(tok.point if tok else None)} tok/s"
            if tok is not None:
                text += f" [{_g(tok.lower)}, {_g(tok.upper)}]"
            lat = point.latency
            text += (f", TTFT p99 {_g(lat.get('ttft_p99_ms'))} ms, TPOT p99 {_g(lat.get('tpot_p99_ms'))} ms, "
                     f"e2e p99 {_g(lat.get('e2e_p99_ms'))} ms")
            if point.goodput_req_s is not None:
                text += f", goodput {_g(point.goodput_req_s.point)} req/s"
            if point.slo_outcome is not None:
                text += f", SLO {point.slo_outcome}"
            parts.append(text)
        lines.append(f"{service.service} ({service.algorithm}): " + "; ".join(parts))
    for speedup in curve.speedups:
        steps = [f"c{p.concurrency} {_g(p.ratio.point)}x [{_g(p.ratio.lower)}, {_g(p.ratio.upper)}]"
                 if p.ratio is not None else f"c{p.concurrency} ?" for p in speedup.points]
        crossing = (f"the crossover: {speedup.crossover_text}" if speedup.crossover_text
                    else "no crossover within the sweep")
        lines.append(f"speed-up {speedup.service}/{speedup.versus}: {', '.join(steps)}; {crossing}")
    return lines


def _interval(out: dict[str, float], key: str, value: Interval | None) -> None:
    if value is None or not math.isfinite(value.point):
        return
    out[key] = round(value.point, 4)
    for side, bound in (("lower", value.lower), ("upper", value.upper)):
        if bound is not None and math.isfinite(bound):
            out[f"{key}.{side}"] = round(bound, 4)


def sweep_metrics(curve: SweepCurve) -> dict[str, float]:
    """The verdict's numbers of a sweep: `perf.<svc>.sweep.c<level>.<metric>` (output_tok_s, request_per_s,
    goodput_req_s, goodput_tok_s with `.lower` / `.upper`; latency percentiles; slo_pass), the speed-ups
    `perf.<svc>.sweep.c<level>.speedup_vs_<twin>`, the crossover `perf.<svc>.sweep.crossover_vs_<twin>` (a
    level, absent when none) and each gate's `perf.<svc>.sweep.<gate>.pass` (`.inconclusive`)."""
    out: dict[str, float] = {}
    for service in curve.services:
        for point in service.measured:
            prefix = f"perf.{service.service}.sweep.c{point.concurrency}."
            _interval(out, prefix + "output_tok_s", point.output_tok_s)
            _interval(out, prefix + "request_per_s", point.request_per_s)
            _interval(out, prefix + "goodput_req_s", point.goodput_req_s)
            _interval(out, prefix + "goodput_tok_s", point.goodput_tok_s)
            for key, value in point.latency.items():
                if value is not None and math.isfinite(value):
                    out[prefix + key] = round(value, 4)
            if point.slo_outcome is not None:
                out[prefix + "slo_pass"] = 1.0 if point.slo_outcome == "pass" else 0.0
            if point.accept_length is not None:
                out[prefix + "accept_length"] = round(point.accept_length, 4)
    for speedup in curve.speedups:
        for step in speedup.points:
            _interval(out, f"perf.{speedup.service}.sweep.c{step.concurrency}.speedup_vs_{speedup.versus}",
                      step.ratio)
        if speedup.crossover is not None:
            out[f"perf.{speedup.service}.sweep.crossover_vs_{speedup.versus}"] = float(speedup.crossover)
    for gate in curve.gates:
        out[f"perf.{gate.service}.sweep.{gate.key}.pass"] = 1.0 if gate.outcome == "pass" else 0.0
        if gate.outcome == "inconclusive":
            out[f"perf.{gate.service}.sweep.{gate.key}.inconclusive"] = 1.0
    return out
