"""Perf baselines: a good run recorded (`--update-baseline`), read back, and the next run judged against it.

    path = baseline_path(Path("reports/baselines"), "ct200", "dflash")   # reports/baselines/ct200/dflash.json
    save_baseline(run, path)
    judgements = judge_baseline(next_run, load_baseline(path), profile.floors["dflash"])
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_dflash.config.targets import file_name, service_file_name
from pytest_dflash.documents import loads_json
from pytest_dflash.layers.perf.judgement import Judgement
from pytest_dflash.layers.perf.judging import confidence_of, refused, same_load
from pytest_dflash.layers.perf.service_run import ServiceRun, write_json
from pytest_dflash.layers.perf.stats import Sample, metric_sample
from pytest_dflash.layers.perf.verdicts import judge_regression
from pytest_dflash.load.results import LoadResult

__all__ = ["BASELINE_METRICS", "DEFAULT_REGRESSION_PCT", "Baseline", "baseline_path", "judge_baseline",
           "load_baseline", "recorded_baseline", "save_baseline"]

DEFAULT_REGRESSION_PCT = 10.0
# Statistics compared with a saved baseline (latency percentiles of a short run are too wide to gate on
# a ratio).
BASELINE_METRICS = ("output_tok_s", "accept_length")
UNITS = {"output_tok_s": "tok/s", "accept_length": "tokens/step"}
_LOSSY = re.compile(r"[^A-Za-z0-9_.-]")  # how file names were made before they were injective


def baseline_path(directory: Path, host: str, service: str) -> Path:
    """``<directory>/<host>/<service>.json``, each name made a file name injectively (config/targets.py: the
    host as its verdict file names it, ``gpu a`` -> ``gpu%20a``; the service unchanged where a profile could
    name it), so two hosts or two services never share a baseline."""
    return directory / file_name(host) / f"{service_file_name(service)}.json"


def recorded_baseline(directory: Path, host: str, service: str) -> Path | None:
    """The file a host's service's baseline is read from: :func:`baseline_path`; else the file recorded under
    the lossy names used before (every character but letters, digits, ``_``, ``-`` and ``.`` written ``_``:
    ``gpu a``, ``gpu:a`` and ``gpu_a`` shared ``gpu_a/``), but only when that file says it was recorded for
    this very host and service. A file at either place that says it was recorded for another (the old
    ``gpu_a/`` of ``gpu a`` is where ``gpu:a`` records now) is not this one's. None when there is none."""
    path = baseline_path(directory, host, service)
    if path.is_file() and _recorded_for(path) in (None, (host, service)):
        return path  # None: whose it is cannot be told; load_baseline says what is wrong with it
    lossy = directory / _LOSSY.sub("_", host) / f"{_LOSSY.sub('_', service)}.json"
    if lossy != path and lossy.is_file() and _recorded_for(lossy) == (host, service):
        return lossy
    return None


def _recorded_for(path: Path) -> tuple[str, str] | None:
    """(host, service) a baseline file says it was recorded for; None: unreadable, or it does not say."""
    try:
        doc = loads_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    meta = doc.get("dflash_perf") if isinstance(doc, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("host"), str) and isinstance(meta.get("service"), str):
        return meta["host"], meta["service"]
    return None


def save_baseline(run: ServiceRun, path: Path) -> Path:
    """Record a good run (its records too: the next run's comparison resamples both)."""
    doc = run.document()
    doc["dflash_perf"]["recorded"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    write_json(path, doc)
    return path


@dataclass(frozen=True)
class Baseline:
    path: Path
    result: LoadResult
    recorded: str


def load_baseline(path: Path) -> Baseline:
    """A baseline written by :func:`save_baseline`; ValueError (naming the file) when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = loads_json(text)
        result = LoadResult.from_json(text)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable perf baseline ({type(exc).__name__}: {exc})") from None
    if (problem := _unmeasurable(result)) is not None:
        raise ValueError(f"{path}: not a readable perf baseline ({problem}): record a new one with "
                         "--update-baseline")
    meta = doc.get("dflash_perf") if isinstance(doc, dict) else None
    recorded = str(meta.get("recorded", "")) if isinstance(meta, dict) else ""
    return Baseline(path, result,
                    recorded or time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result.end_wall)))


def _count(value: object) -> bool:
    """A token or step count as a recorded run writes it: absent, or a whole number >= 0."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _unmeasurable(result: LoadResult) -> str | None:
    """What in a baseline (edited by hand, or damaged) its numbers cannot be compared from, or None. A run the
    layer recorded never has one; without this check a duration of 0 dropped the throughput comparison
    (only accept length was judged, and passed) and a NaN crashed the bootstrap."""
    duration = result.metrics.get("duration")
    if not isinstance(duration, int | float) or isinstance(duration, bool) or not 0 < duration < math.inf:
        return f"its duration {duration!r} is not a positive number of seconds"
    ok = result.successful
    if not ok:
        return "it has no successful measured request"
    for record in ok:
        e2e = record.e2e_ms
        if e2e is not None and (not isinstance(e2e, int | float) or not 0 <= e2e < math.inf):
            return f"request {record.index}: e2e_ms {e2e!r} is not a finite number of milliseconds"
        if not (_count(record.output_tokens) and _count(record.verify_ct)):
            return (f"request {record.index}: output_tokens {record.output_tokens!r} / verify_ct "
                    f"{record.verify_ct!r} are not token counts")
    if not sum(r.output_tokens or 0 for r in ok):
        return "its requests generated no token"
    return None


def judge_baseline(run: ServiceRun, baseline: Baseline, floors: Mapping[str, float | str]) -> list[Judgement]:
    """Regression of ``BASELINE_METRICS`` beyond ``regression_pct`` (default 10 %); old vs new in the
    message."""
    raw_pct = floors.get("regression_pct", DEFAULT_REGRESSION_PCT)
    pct = float(raw_pct) if isinstance(raw_pct, int | float) else DEFAULT_REGRESSION_PCT
    confidence = confidence_of(floors)
    if run.refusal:
        return [refused("baseline", run)]
    diff = same_load(run.result.spec, baseline.result.spec)
    if diff:
        return [refused("baseline", run, why=f"the baseline {baseline.path} was recorded with another load "
                                              f"({', '.join(diff)}): record a new one with "
                                              "--update-baseline")]
    out: list[Judgement] = []
    for metric in BASELINE_METRICS:
        try:
            current, old = metric_sample(run.result, metric), metric_sample(baseline.result, metric)
        except ValueError:
            continue  # e.g. no accept length on a NONE service
        key = f"baseline.{metric}"
        verdict = judge_regression(f"{metric} vs baseline", current, old, max_regression_pct=pct,
                                   confidence=confidence)
        now, then = _sample_point(current), _sample_point(old)
        change = (now / then - 1) * 100 if then else math.nan
        unit = UNITS.get(metric, "")
        detail = (f"; {metric} {_fmt(then, 4)} -> {_fmt(now, 4)} {unit} ({change:+.1f}%) since the baseline "
                  f"recorded {baseline.recorded}")
        out.append(Judgement.of(key, verdict, message=verdict.message + detail))
    if not out:
        out.append(Judgement(key="baseline", outcome="inconclusive",
                             message=f"baseline: INCONCLUSIVE — no statistic in common with {baseline.path}"))
    return out


def _sample_point(sample: Sample) -> float:
    """The point estimate of a ratio sample (throughput, accept length): scale · Σ values / Σ denominators."""
    if sample.denominators is None:
        return float(sample.values.mean())
    total = float(sample.denominators.sum())
    return sample.scale * float(sample.values.sum()) / total if total else math.nan


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
