"""The data model of a load sweep: what `reports/perf/<host>/sweep.json` holds and what the pictures are drawn
from. Pure data (frozen dataclasses, `to_json` / `from_json`); building it from load runs is build.py's job,
judging it gates.py's.

    curve = SweepCurve.from_json(path.read_text())
    for service in curve.services:
        for level in service.measured:
            print(service.service, level.concurrency, level.output_tok_s.point, level.latency["ttft_p99_ms"])
    for speedup in curve.speedups:
        print(speedup.service, "vs", speedup.versus, "crossover at", speedup.crossover)

Every rate carries its bounds (`Interval`: point and one-sided lower / upper bounds, each at `confidence`);
a level that was not measured is kept with `status = "not_run"` and `why` (the budget spent, the early stop),
so a plot can mark it and a gate can call itself inconclusive instead of passing on a missing point.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["FORMAT", "LATENCY_KEYS", "GateResult", "Interval", "LevelPoint", "LevelStatus", "ServiceCurve",
           "SloCheck", "SpeedupCurve", "SpeedupPoint", "SweepCurve"]

FORMAT = "pytest-dflash/sweep/1"
LevelStatus = Literal["measured", "not_run"]
# The latency percentiles every measured level carries (ms; None when the run had no such value).
LATENCY_KEYS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms",
                "e2e_p50_ms", "e2e_p99_ms")


def _num(value: Any) -> float | None:
    """A JSON number back to a float (None stays None; NaN / inf were written as None)."""
    return None if value is None else float(value)


def _clean(doc: Any) -> Any:
    """NaN / inf -> None, recursively: sweep.json is strict JSON."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: _clean(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_clean(v) for v in doc]
    return doc


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A measured number with its one-sided bounds (each at `confidence`); a bound may be None (not finite:
    e.g. the p99 of too few requests has no upper bound)."""

    point: float
    lower: float | None
    upper: float | None
    confidence: float = 0.95

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Interval:
        return cls(point=float(data["point"]), lower=_num(data.get("lower")), upper=_num(data.get("upper")),
                   confidence=float(data.get("confidence", 0.95)))

    def describe(self, unit: str = "") -> str:
        """'412.3 tok/s [398.1, 425.0]'."""
        def g(x: float | None) -> str:
            return "?" if x is None else f"{x:.4g}"
        return f"{g(self.point)}{unit} [{g(self.lower)}, {g(self.upper)}]"


@dataclass(frozen=True, kw_only=True)
class SloCheck:
    """One SLO judged at one level: `key` (ttft_p99_ms …) against `threshold` on its confidence bound."""

    key: str
    threshold: float
    outcome: str  # pass / fail / inconclusive / refused (layers/perf/judgement.py)
    message: str
    point: float | None = None
    lower: float | None = None
    upper: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SloCheck:
        return cls(key=str(data["key"]), threshold=float(data["threshold"]), outcome=str(data["outcome"]),
                   message=str(data.get("message", "")), point=_num(data.get("point")),
                   lower=_num(data.get("lower")), upper=_num(data.get("upper")))


@dataclass(frozen=True, kw_only=True)
class LevelPoint:
    """One service at one concurrency level: measured (numbers with bounds, SLO outcome) or not run
    (`why`)."""

    concurrency: int
    status: LevelStatus = "measured"
    why: str | None = None  # not_run: "sweep_budget 2m spent", "early stop: ..."
    requests: int = 0  # measured requests that completed
    failed: int = 0
    duration_s: float = 0.0
    attempts: int = 1  # 2 when the level broke its SLOs and was measured again
    saturated: bool = False  # the load client was the bottleneck: no timing judged on this level
    output_tok_s: Interval | None = None
    request_per_s: Interval | None = None
    latency: Mapping[str, float | None] = field(default_factory=dict)  # LATENCY_KEYS, in ms
    goodput_req_s: Interval | None = None  # requests/s of requests within every SLO (None without [slo])
    goodput_tok_s: Interval | None = None  # their output tokens/s
    goodput_fraction: float | None = None
    slo_outcome: str | None = None  # pass / fail / inconclusive / refused; None without [slo]
    slo_checks: tuple[SloCheck, ...] = ()
    accept_length: float | None = None

    @property
    def measured(self) -> bool:
        return self.status == "measured"

    @classmethod
    def not_run(cls, concurrency: int, why: str) -> LevelPoint:
        return cls(concurrency=concurrency, status="not_run", why=why, attempts=0)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LevelPoint:
        def interval(name: str) -> Interval | None:
            value = data.get(name)
            return None if value is None else Interval.from_dict(value)

        return cls(concurrency=int(data["concurrency"]), status=data.get("status", "measured"),
                   why=data.get("why"), requests=int(data.get("requests", 0)),
                   failed=int(data.get("failed", 0)),
                   duration_s=float(data.get("duration_s", 0.0)), attempts=int(data.get("attempts", 1)),
                   saturated=bool(data.get("saturated", False)), output_tok_s=interval("output_tok_s"),
                   request_per_s=interval("request_per_s"),
                   latency={k: _num(v) for k, v in dict(data.get("latency", {})).items()},
                   goodput_req_s=interval("goodput_req_s"), goodput_tok_s=interval("goodput_tok_s"),
                   goodput_fraction=_num(data.get("goodput_fraction")), slo_outcome=data.get("slo_outcome"),
                   slo_checks=tuple(SloCheck.from_dict(c) for c in data.get("slo_checks", [])),
                   accept_length=_num(data.get("accept_length")))


@dataclass(frozen=True, kw_only=True)
class ServiceCurve:
    """One service along the sweep: one LevelPoint per level of the sweep, in order."""

    service: str
    algorithm: str
    levels: tuple[LevelPoint, ...]
    slo: Mapping[str, float] = field(default_factory=dict)  # judged on this service: [slo] + [slo.SERVICE]
    stopped: str | None = None  # why higher levels were not run (early stop), if they were not

    @property
    def measured(self) -> tuple[LevelPoint, ...]:
        return tuple(level for level in self.levels if level.measured)

    def at(self, concurrency: int) -> LevelPoint | None:
        return next((level for level in self.levels if level.concurrency == concurrency), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServiceCurve:
        return cls(service=str(data["service"]), algorithm=str(data["algorithm"]),
                   levels=tuple(LevelPoint.from_dict(p) for p in data["levels"]),
                   slo={k: float(v) for k, v in dict(data.get("slo", {})).items()},
                   stopped=data.get("stopped"))


@dataclass(frozen=True, kw_only=True)
class SpeedupPoint:
    """Output tok/s of a service over its twin's at one level (both resampled); None + `why` when either
    was not measured there. `versus_1x`: the ratio judged against 1x on its bounds (pass: confidently
    faster, fail: confidently slower, inconclusive: straddling 1x or too short a run, fewer than 20
    resampling blocks); the crossover is the first `fail`."""

    concurrency: int
    ratio: Interval | None = None
    why: str | None = None
    versus_1x: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpeedupPoint:
        ratio = data.get("ratio")
        return cls(concurrency=int(data["concurrency"]),
                   ratio=None if ratio is None else Interval.from_dict(ratio), why=data.get("why"),
                   versus_1x=data.get("versus_1x"))


@dataclass(frozen=True, kw_only=True)
class SpeedupCurve:
    """A speculative service against its plain twin along the sweep, and where speculation stops paying.

    `crossover`: the first level whose speed-up is confidently below 1x (upper bound < 1), None when no level
    is; `crossover_text` says it in words ("dflash (DFLASH) is slower than none from concurrency 16 (0.82x,
    95% upper bound 0.91x)")."""

    service: str
    versus: str
    algorithm: str
    versus_algorithm: str
    points: tuple[SpeedupPoint, ...]
    crossover: int | None = None
    crossover_text: str | None = None

    def at(self, concurrency: int) -> SpeedupPoint | None:
        return next((p for p in self.points if p.concurrency == concurrency), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpeedupCurve:
        return cls(service=str(data["service"]), versus=str(data["versus"]), algorithm=str(data["algorithm"]),
                   versus_algorithm=str(data["versus_algorithm"]),
                   points=tuple(SpeedupPoint.from_dict(p) for p in data["points"]),
                   crossover=None if data.get("crossover") is None else int(data["crossover"]),
                   crossover_text=data.get("crossover_text"))


@dataclass(frozen=True, kw_only=True)
class GateResult:
    """A gate judged on the curve (gates.py): `max_concurrency_within_slo`, `goodput_at.16`,
    `crossover_vs_none`."""

    service: str
    key: str
    outcome: str  # pass / fail / inconclusive
    message: str
    level: int | None = None  # the level the outcome turned on, where one did
    threshold: float | None = None
    bound: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateResult:
        return cls(service=str(data["service"]), key=str(data["key"]), outcome=str(data["outcome"]),
                   message=str(data.get("message", "")),
                   level=None if data.get("level") is None else int(data["level"]),
                   threshold=_num(data.get("threshold")), bound=_num(data.get("bound")))


@dataclass(frozen=True, kw_only=True)
class SweepCurve:
    """A host's sweep: the load shape, the levels, every service's curve, the speed-ups, the gates
    judged."""

    host: str
    levels: tuple[int, ...]
    services: tuple[ServiceCurve, ...]
    speedups: tuple[SpeedupCurve, ...] = ()
    gates: tuple[GateResult, ...] = ()
    load: Mapping[str, Any] = field(default_factory=dict)  # endpoint, prompt/output length, requests
    slo: Mapping[str, float] = field(default_factory=dict)  # [slo] (per service: ServiceCurve.slo)
    confidence: float = 0.95
    budget_s: float | None = None  # sweep_budget
    spent_s: float = 0.0  # wall time the sweep took
    written: str = ""
    format: str = FORMAT

    def service(self, name: str) -> ServiceCurve | None:
        return next((s for s in self.services if s.service == name), None)

    def speedup(self, service: str, versus: str) -> SpeedupCurve | None:
        return next((s for s in self.speedups if s.service == service and s.versus == versus), None)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = _clean(asdict(self))
        return doc

    def to_json(self, *, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepCurve:
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"sweep curve: format {data.get('format')!r} is not {FORMAT!r}")
        return cls(host=str(data["host"]), levels=tuple(int(x) for x in data["levels"]),
                   services=tuple(ServiceCurve.from_dict(s) for s in data["services"]),
                   speedups=tuple(SpeedupCurve.from_dict(s) for s in data.get("speedups", [])),
                   gates=tuple(GateResult.from_dict(g) for g in data.get("gates", [])),
                   load=dict(data.get("load", {})),
                   slo={k: float(v) for k, v in dict(data.get("slo", {})).items()},
                   confidence=float(data.get("confidence", 0.95)),
                   budget_s=_num(data.get("budget_s")), spent_s=float(data.get("spent_s", 0.0)),
                   written=str(data.get("written", "")))

    @classmethod
    def from_json(cls, text: str) -> SweepCurve:
        return cls.from_dict(json.loads(text))

