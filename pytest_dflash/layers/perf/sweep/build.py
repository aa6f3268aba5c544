"""From load runs to a curve: one `LoadResult` per service per level -> `LevelPoint`s (throughput and goodput
with bounds, latency percentiles, every SLO judged on its confidence bound) and `SpeedupCurve`s (a speculative
service over its twin, level by level, and the crossover).

    curve = curve_from_runs({"none": {1: r1, 8: r8}, "dflash": {1: d1, 8: d8}}, host="h100",
                            algorithms={"none": "NONE", "dflash": "DFLASH"}, slo={"ttft_p99_ms": 500})
    curve = curve_from_files(Path("tests/data/sglang-0.5.17-h100-sweep").glob("*.json"), host="h100")

Goodput follows `sglang.bench_serving --goodput` / `vllm bench serve --goodput`: a request is *good* when it
meets every objective set (its TTFT <= the TTFT SLO, its TPOT <= the TPOT SLO, its e2e <= the e2e SLO, its p99
ITL <= the ITL SLO); goodput is the rate of good requests (and of their output tokens), resampled like
throughput (stats.py: blocks of `concurrency` requests).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pytest_dflash.layers.perf.judgement import Judgement
from pytest_dflash.layers.perf.stats import (
    Bound,
    Sample,
    bootstrap_bound,
    metric_sample,
    point_of,
    ratio_bound,
)
from pytest_dflash.layers.perf.verdicts import judge_bound, judge_floor
from pytest_dflash.load.curve import (
    LATENCY_KEYS,
    Interval,
    LevelPoint,
    ServiceCurve,
    SloCheck,
    SpeedupCurve,
    SpeedupPoint,
    SweepCurve,
)
from pytest_dflash.load.monitor import judge_saturation
from pytest_dflash.load.results import LoadResult
from pytest_dflash.load.spec import Slo

__all__ = ["KNOWN_ALGORITHMS", "algorithm_of_name", "comparison_pairs", "crossover_text", "curve_from_files",
           "curve_from_runs", "goodput_sample", "judge_slo", "level_point", "per_request_slo", "slo_outcome",
           "speedup_bound", "speedup_curve", "with_client_limits"]


def per_request_slo(objectives: Mapping[str, float]) -> Slo:
    """The per-request thresholds of goodput: each metric's SLO value (the loosest where the table sets
    several statistics of one metric, e.g. ttft_p50_ms and ttft_p99_ms)."""
    limits: dict[str, float] = {}
    for key, value in objectives.items():
        series = key.split("_", 1)[0]
        limits[series] = max(limits.get(series, 0.0), float(value))
    return Slo(ttft_ms=limits.get("ttft"), itl_ms=limits.get("itl"), tpot_ms=limits.get("tpot"),
               e2e_ms=limits.get("e2e"))


def judge_slo(result: LoadResult, objectives: Mapping[str, float], *,
              confidence: float = 0.95) -> list[Judgement]:
    """Every SLO of a level judged on its confidence bound (a ceiling), after its errors: a level whose
    requests failed breaks its SLOs whatever the latencies; a saturated client refuses the timings."""
    out: list[Judgement] = []
    failed = int(result.metrics.get("failed") or 0)
    if failed:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(result.errors_by_kind.items()))
        out.append(Judgement(key="errors", outcome="fail", point=float(failed),
                             message=f"errors: FAIL — {failed} requests failed ({kinds})"))
    for key, threshold in objectives.items():
        if result.client_saturated:
            out.append(Judgement(key=key, outcome="refused", threshold=threshold,
                                 message=f"{key}: REFUSED — no judgement: the load client was saturated "
                                         f"({'; '.join(result.saturation.reasons)})"))
            continue
        try:
            sample = metric_sample(result, key)
        except ValueError as exc:
            out.append(Judgement(key=key, outcome="inconclusive", threshold=threshold,
                                 message=f"{key}: INCONCLUSIVE — cannot be measured: {exc}"))
            continue
        out.append(Judgement.of(key, judge_floor(key, sample, threshold, higher_is_better=False,
                                                 confidence=confidence)))
    return out


def slo_outcome(judgements: Sequence[Judgement]) -> str | None:
    """fail when any SLO confidently breaks; inconclusive (or refused) when one cannot be decided; pass."""
    if not judgements:
        return None
    outcomes = {j.outcome for j in judgements}
    for outcome in ("fail", "refused", "inconclusive"):
        if outcome in outcomes:
            return outcome
    return "pass"


def goodput_sample(result: LoadResult, slo: Slo, *, tokens: bool) -> Sample:
    """Requests/s (or output tok/s) of the requests within `slo`, resampled like throughput."""
    ok = result.successful
    if not ok:
        raise ValueError("goodput: the run has no successful request")
    duration = float(result.metrics["duration"])
    block = max(1, int(result.metrics.get("max_concurrency") or 1))
    values = [(float(r.output_tokens or 0) if tokens else 1.0) if r.meets(slo) else 0.0 for r in ok]
    e2e = [(r.e2e_ms or 0.0) / 1000.0 for r in ok]
    return Sample.throughput(values, e2e, duration, block=block, unit="tok/s" if tokens else "req/s")


def _interval(bound: Bound) -> Interval:
    def finite(x: float) -> float | None:
        return x if x == x and abs(x) != float("inf") else None
    return Interval(point=bound.point, lower=finite(bound.lower), upper=finite(bound.upper),
                    confidence=bound.confidence)


def _bounded(sample: Sample, confidence: float) -> Interval | None:
    try:
        return _interval(bootstrap_bound(sample, confidence=confidence))
    except ValueError:
        return None


def level_point(result: LoadResult, objectives: Mapping[str, float], *, confidence: float = 0.95,
                attempts: int = 1, judgements: Sequence[Judgement] | None = None) -> LevelPoint:
    """One service at one level: throughput, goodput and latencies with what the SLOs made of them."""
    checks = (list(judgements) if judgements is not None
              else judge_slo(result, objectives, confidence=confidence))
    latency: dict[str, float | None] = {}
    for key in LATENCY_KEYS:
        try:
            latency[key] = round(point_of(metric_sample(result, key)), 4)  # as measured: no resampling
        except ValueError:
            latency[key] = None
    throughput = request_rate = good_req = good_tok = None
    if result.successful:
        throughput = _bounded(metric_sample(result, "output_tok_s"), confidence)
        request_rate = _bounded(metric_sample(result, "request_per_s"), confidence)
        if objectives:
            slo = per_request_slo(objectives)
            good_req = _bounded(goodput_sample(result, slo, tokens=False), confidence)
            good_tok = _bounded(goodput_sample(result, slo, tokens=True), confidence)
    fraction = None
    if objectives and result.measured:
        slo = per_request_slo(objectives)
        fraction = sum(1 for r in result.measured if r.meets(slo)) / len(result.measured)
    spec = [r for r in result.successful if r.verify_ct]
    accept = (sum(float(r.output_tokens or 0) for r in spec) / sum(float(r.verify_ct or 0) for r in spec)
              if spec else None)
    m = result.metrics
    return LevelPoint(
        concurrency=int(result.spec.concurrency or 1), requests=int(m.get("completed") or 0),
        failed=int(m.get("failed") or 0), duration_s=float(m.get("duration") or 0.0), attempts=attempts,
        saturated=result.client_saturated, output_tok_s=throughput, request_per_s=request_rate,
        latency=latency, goodput_req_s=good_req, goodput_tok_s=good_tok, goodput_fraction=fraction,
        slo_outcome=slo_outcome(checks),
        slo_checks=tuple(SloCheck(key=j.key, threshold=j.threshold or 0.0, outcome=j.outcome,
                                  message=j.message, point=j.point, lower=j.lower, upper=j.upper)
                         for j in checks),
        accept_length=accept)


def speedup_bound(a: LoadResult, b: LoadResult, *, confidence: float = 0.95) -> Bound:
    """Output tok/s of `a` over `b`'s, both resampled (ValueError when either has no successful request)."""
    return ratio_bound(metric_sample(a, "output_tok_s"), metric_sample(b, "output_tok_s"),
                       confidence=confidence)


def crossover_text(service: str, algorithm: str, versus: str, level: int, ratio: Interval) -> str:
    """'dflash (DFLASH) is slower than none from concurrency 16 (0.82x, 95% upper bound 0.91x)'."""
    upper = "?" if ratio.upper is None else f"{ratio.upper:.2f}x"
    return (f"{service} ({algorithm}) is slower than {versus} from concurrency {level} ({ratio.point:.2f}x, "
            f"{ratio.confidence:.0%} upper bound {upper})")


def speedup_curve(service: str, algorithm: str, versus: str, versus_algorithm: str, levels: Sequence[int],
                  runs: Mapping[int, LoadResult | None], twin_runs: Mapping[int, LoadResult | None], *,
                  why_not: Mapping[int, str] | None = None, confidence: float = 0.95) -> SpeedupCurve:
    """The speed-up level by level and the crossover: the first level where it is judged below 1x (its upper
    bound under 1x, from a run long enough to judge: judge_bound's 20 resampling blocks)."""
    points: list[SpeedupPoint] = []
    crossover: int | None = None
    text: str | None = None
    for level in levels:
        a, b = runs.get(level), twin_runs.get(level)
        if a is None or b is None:
            why = (why_not or {}).get(level) or f"{service if a is None else versus} was not measured there"
            points.append(SpeedupPoint(concurrency=level, why=why))
            continue
        if a.client_saturated or b.client_saturated:
            points.append(SpeedupPoint(concurrency=level, why="the load client was saturated"))
            continue
        try:
            bound = speedup_bound(a, b, confidence=confidence)
        except ValueError as exc:
            points.append(SpeedupPoint(concurrency=level, why=str(exc)))
            continue
        ratio = _interval(bound)
        verdict = judge_bound(f"speed-up {service}/{versus} at concurrency {level}", bound, 1.0)
        points.append(SpeedupPoint(concurrency=level, ratio=ratio, versus_1x=verdict.outcome))
        if crossover is None and verdict.outcome == "fail":
            crossover, text = level, crossover_text(service, algorithm, versus, level, ratio)
    return SpeedupCurve(service=service, versus=versus, algorithm=algorithm,
                        versus_algorithm=versus_algorithm, points=tuple(points), crossover=crossover,
                        crossover_text=text)


def comparison_pairs(algorithms: Mapping[str, str]) -> list[tuple[str, str]]:
    """Each speculative service against each plain (NONE) one: the twins whose curves cross."""
    return [(a, b) for a, alg_a in algorithms.items() for b, alg_b in algorithms.items()
            if a != b and alg_a != "NONE" and alg_b == "NONE"]


def curve_from_runs(runs: Mapping[str, Mapping[int, LoadResult]], *, host: str, algorithms: Mapping[str, str],
                    slo: Mapping[str, float] | None = None,
                    service_slo: Mapping[str, Mapping[str, float]] | None = None,
                    levels: Sequence[int] | None = None, pairs: Sequence[tuple[str, str]] | None = None,
                    confidence: float = 0.95) -> SweepCurve:
    """A curve from load runs already made (one LoadResult per service per level; a level a service lacks is
    kept as not run). `slo`: the objectives of every service; `service_slo`: one service's, over them;
    `pairs`: the (service, twin) speed-ups to state (default: each speculative service over each plain
    one)."""
    all_levels = tuple(sorted(set(levels or ()) | {lvl for per in runs.values() for lvl in per}))
    services: list[ServiceCurve] = []
    for name, per_level in runs.items():
        objectives = {**(slo or {}), **(service_slo or {}).get(name, {})}
        points = [level_point(per_level[lvl], objectives, confidence=confidence) if lvl in per_level
                  else LevelPoint.not_run(lvl, "not run: no load run at this level") for lvl in all_levels]
        services.append(ServiceCurve(service=name, algorithm=algorithms.get(name, "NONE"),
                                     levels=tuple(points), slo=objectives))
    present = {k: v for k, v in algorithms.items() if k in runs}
    wanted = pairs if pairs is not None else comparison_pairs(present)
    speedups = [speedup_curve(a, algorithms[a], b, algorithms[b], all_levels, dict(runs[a]), dict(runs[b]),
                              confidence=confidence) for a, b in wanted if a in runs and b in runs]
    first = next((r for per in runs.values() for r in per.values()), None)
    load = {} if first is None else {k: first.spec.to_dict().get(k) for k in
                                     ("endpoint", "prompt_len", "output_len", "dataset", "temperature")}
    return SweepCurve(host=host, levels=all_levels, services=tuple(services), speedups=tuple(speedups),
                      load=load, slo=dict(slo or {}), confidence=confidence)


_LEVEL_SUFFIX = re.compile(r"[._-]+(?:c|conc|concurrency|level)?[._-]?\d+$", re.I)
_LEVEL_PREFIX = re.compile(r"^(?:c|conc|concurrency|level)?[._-]?\d+[._-]+", re.I)
_LEVEL_ONLY = re.compile(r"(?:c|conc|concurrency|level)?[._-]?\d+", re.I)


def _service_of(path: Path, doc: Mapping[str, object]) -> tuple[str, str | None]:
    """(service, algorithm) of one load-run file: the perf layer's `dflash_perf` record, else the file name
    without its level (`dflash-c16.json`, `ddtree.c4.json`, `none_1.json`); the algorithm, where the file
    does not say it, from a service named for it."""
    perf = doc.get("dflash_perf")
    if isinstance(perf, dict) and perf.get("service"):
        return str(perf["service"]), str(perf.get("algorithm") or "") or None
    base = run_file_stem(path)
    if _LEVEL_ONLY.fullmatch(base):  # <service>/c16.json
        return path.parent.name, None
    stem = _LEVEL_SUFFIX.sub("", base)  # dflash-c16, dflash_16, dflash.concurrency16
    return _LEVEL_PREFIX.sub("", stem) if stem == base else stem, None  # c16-dflash


def run_file_stem(path: Path) -> str:
    """`dflash-c16` of `dflash-c16.json` and of `dflash-c16.json.gz`."""
    name = path.name
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def read_run_text(path: Path) -> str:
    """A load-run file's JSON text, gunzipped when it ends in .gz (recordings are kept compressed)."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return handle.read()
    return path.read_text(encoding="utf-8")


KNOWN_ALGORITHMS = ("NONE", "DFLASH", "DDTREE", "NGRAM", "EAGLE", "EAGLE3", "STANDALONE")


def with_client_limits(result: LoadResult, *, max_loop_lag_ms: float | None = None,
                       max_client_cpu: float | None = None) -> LoadResult:
    """The run with its client's saturation judged again under other limits, from the event-loop lag p99 and
    loop CPU it recorded (load/monitor.py's closed-loop rule); the spec then carries the limits used."""
    spec = dataclasses.replace(
        result.spec,
        max_loop_lag_ms=result.spec.max_loop_lag_ms if max_loop_lag_ms is None else max_loop_lag_ms,
        max_client_cpu=result.spec.max_client_cpu if max_client_cpu is None else max_client_cpu)
    sat = judge_saturation(dataclasses.replace(result.saturation), spec)  # a copy: the recorded one stays
    return dataclasses.replace(result, spec=spec, saturation=sat)


def algorithm_of_name(service: str) -> str | None:
    """The algorithm a service is named for: `dflash`, `ddtree-b32` (DDTREE), `plain` (NONE); None."""
    upper = service.upper()
    if upper in ("PLAIN", "BASELINE", "TARGET"):
        return "NONE"
    return next((alg for alg in sorted(KNOWN_ALGORITHMS, key=len, reverse=True)
                 if upper == alg or re.match(rf"{alg}[._-]", upper)), None)


def curve_from_files(paths: Iterable[Path], *, host: str, algorithms: Mapping[str, str] | None = None,
                     slo: Mapping[str, float] | None = None, confidence: float = 0.95,
                     max_loop_lag_ms: float | None = None, max_client_cpu: float | None = None) -> SweepCurve:
    """A curve from load-run JSON files (`python -m pytest_dflash.load URL --out FILE --concurrency C`, or the
    perf layer's per-service JSON; gzipped ones too): one per service per level, the level read from the run's
    own spec. `algorithms` names each service's algorithm where neither the file nor the service's name does.
    `max_loop_lag_ms` / `max_client_cpu`: judge the client's saturation again from the lags and CPU each run
    recorded, with these limits (the policy a profile's [perf] sets; a run records the limits it ran with)."""
    runs: dict[str, dict[int, LoadResult]] = {}
    named: dict[str, str] = dict(algorithms or {})
    for path in sorted(paths):
        text = read_run_text(path)
        doc = json.loads(text)
        result = LoadResult.from_json(text)
        if max_loop_lag_ms is not None or max_client_cpu is not None:
            result = with_client_limits(result, max_loop_lag_ms=max_loop_lag_ms,
                                        max_client_cpu=max_client_cpu)
        service, algorithm = _service_of(path, doc)
        level = int(result.spec.concurrency or 1)
        if level in runs.setdefault(service, {}):
            raise ValueError(f"{path}: a second run of {service} at concurrency {level}")
        runs[service][level] = result
        if algorithm and service not in named:
            named[service] = algorithm
    for service in runs:
        if service not in named:
            guessed = algorithm_of_name(service)
            if guessed is None:
                raise ValueError(f"{service}: its algorithm is not known (name it: algorithms={{{service!r}: "
                                 "'DFLASH'}, or name the files for it: none-c1.json, dflash-c1.json)")
            named[service] = guessed
    return curve_from_runs(runs, host=host, algorithms=named, slo=slo, confidence=confidence)

