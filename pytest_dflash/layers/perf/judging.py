"""Judging one perf run against the host's floors and its peers: errors, output tok/s, latency ceilings,
accept length, and the speed-up of one service over another at the same load.

    for judgement in judge_floors(run, profile.floors["dflash"]):
        print(judgement.outcome, judgement.message)

Every judgement is made on a confidence bound over requests (`pytest_dflash.layers.perf.stats`), never on a
point estimate; the outcomes are described in `pytest_dflash.layers.perf.judgement`. Nothing here imports
pytest: the `dflash_perf` fixture (layer.py) turns these outcomes into test outcomes.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_dflash.config.tables.floors import LATENCY_FLOOR
from pytest_dflash.layers.parity.acceptance import over_block, required_floor
from pytest_dflash.layers.perf.judgement import Comparison, Judgement
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.stats import metric_sample, ratio_bound
from pytest_dflash.layers.perf.token_latency import WHOLE_STREAM_MS, hidden_tpot_bound_ms
from pytest_dflash.layers.perf.verdicts import judge_floor, judge_ratio
from pytest_dflash.load.spec import LoadSpec

__all__ = ["COMPARABLE_FIELDS", "DEFAULT_CONFIDENCE", "compare", "comparison_pairs", "confidence_of",
           "judge_accept_length", "judge_errors", "judge_floors", "judge_speedup", "refused", "same_load",
           "stream_arrived_whole"]

DEFAULT_CONFIDENCE = 0.95
# Runs are comparable (a speed-up, a baseline) only when they were measured with the same load.
COMPARABLE_FIELDS = ("endpoint", "concurrency", "request_rate", "prompt_len", "output_len", "dataset",
                     "temperature", "top_p", "top_k", "ignore_eos")


def refused(key: str, run: ServiceRun, threshold: float | None = None, why: str | None = None) -> Judgement:
    reason = why or run.refusal or ""
    return Judgement(key=key, outcome="refused", threshold=threshold,
                     message=f"{key}: REFUSED — no judgement: {reason}")


def stream_arrived_whole(run: ServiceRun, threshold_ms: float | None = None) -> str | None:
    """Why inter-token latency was not measured on this run, or None: every streamed request's tokens came
    within WHOLE_STREAM_MS of its first one, and the time to the first token could hide more per token than
    `threshold_ms` (`token_latency.hidden_tpot_bound_ms`). A buffering proxy or gateway hands the stream over
    in one piece: every gap is ~0, and an ITL or TPOT ceiling would pass having seen no gap a client would."""
    streamed = [r for r in run.result.successful if r.itl_ms and (r.output_tokens or 0) >= 2]
    if not streamed or any(sum(r.itl_ms) >= WHOLE_STREAM_MS for r in streamed):
        return None
    bounds = [hidden_tpot_bound_ms(r.ttft_ms or 0.0, r.output_tokens or 0) for r in streamed]
    if threshold_ms is not None and all(b is not None and b <= threshold_ms for b in bounds):
        return None  # a server this fast (or a buffer in front of one): no hidden gap can reach the ceiling
    first = streamed[0]
    return (f"every stream was delivered whole: in each of {len(streamed)} requests all tokens came within "
            f"{WHOLE_STREAM_MS:g} ms of the first (e.g. {first.output_tokens} tokens in "
            f"{sum(first.itl_ms):.3f} ms after a TTFT of {first.ttft_ms or 0:.0f} ms); a proxy or gateway "
            "buffers the stream, so the gaps between tokens a client sees were not measured")


def _judge_metric(run: ServiceRun, key: str, threshold: float, *, higher_is_better: bool,
                  confidence: float) -> Judgement:
    if run.refusal:
        return refused(key, run, threshold)
    if key.startswith(("itl_", "tpot_")) and (whole := stream_arrived_whole(run, threshold)):
        return Judgement(key=key, outcome="inconclusive", threshold=threshold,
                         message=f"{key}: INCONCLUSIVE — cannot be measured on this run: {whole}")
    try:
        sample = metric_sample(run.result, key)
    except ValueError as exc:
        return Judgement(key=key, outcome="inconclusive", threshold=threshold,
                         message=f"{key}: INCONCLUSIVE — cannot be measured on this run: {exc}")
    return Judgement.of(key, judge_floor(key, sample, threshold, higher_is_better=higher_is_better,
                                         confidence=confidence))


def confidence_of(floors: Mapping[str, float | str]) -> float:
    value = floors.get("confidence", DEFAULT_CONFIDENCE)
    return float(value) if isinstance(value, int | float) else DEFAULT_CONFIDENCE


def judge_errors(run: ServiceRun) -> Judgement:
    """A perf run in which requests failed is a failure whatever its numbers (errors are not slowness)."""
    metrics = run.result.metrics
    completed, failed = int(metrics["completed"]), int(metrics["failed"])
    if not failed:
        return Judgement(key="errors", outcome="pass", point=0.0,
                         message=f"errors: pass — all {completed} measured requests completed")
    kinds = ", ".join(f"{k}={v}" for k, v in sorted(run.result.errors_by_kind.items()))
    first = next((r.error for r in run.result.measured if r.error is not None), None)
    return Judgement(key="errors", outcome="fail", point=float(failed),
                     message=f"errors: FAIL — {failed} of {completed + failed} requests failed ({kinds}); "
                             f"first: {first}")


def judge_floors(run: ServiceRun, floors: Mapping[str, float | str]) -> list[Judgement]:
    """Errors, then ``output_tok_s`` (a floor) and every latency ceiling (``ttft_p99_ms`` …) of the
    service."""
    confidence = confidence_of(floors)
    out = [judge_errors(run)]
    for key, value in floors.items():
        if key == "output_tok_s" and isinstance(value, int | float):
            out.append(_judge_metric(run, key, float(value), higher_is_better=True, confidence=confidence))
        elif LATENCY_FLOOR.match(key) and isinstance(value, int | float):
            out.append(_judge_metric(run, key, float(value), higher_is_better=False, confidence=confidence))
    return out


def judge_accept_length(run: ServiceRun, floors: Mapping[str, float | str], *,
                        unaccepted_draft: str | None = None, source: str = "the profile",
                        block: int | None = None) -> Judgement:
    """Per-request accept length (``meta_info`` of native /generate), token-weighted, against the floor.

    The floor is the parity layer's (`acceptance.required_floor`, one rule for smoke, parity and perf): the
    ``accept_length`` floor; without one, at least one token per verify step for a service whose profile
    declares `unaccepted_draft`, else the default minimum `acceptance.DEFAULT_MIN_ACCEPT_LENGTH` (no
    speculation in name only). The server-side value (``/server_info`` after ``/flush_cache``) is reported
    next to it. `block` (the server's speculative_num_draft_tokens, where known): a request with more tokens
    than its verify steps of `block` tokens can emit (plus the prefill's one) fails, as in
    `acceptance.check_accounting`: the server miscounts, and the ratio would pass any floor.
    """
    key = "accept_length"
    floor = required_floor(run.service, floors, unaccepted_draft=unaccepted_draft, source=source)
    threshold = floor.value
    name = key if isinstance(floors.get(key), int | float) else f"{key} (no floor set: {floor.where})"
    server = run.result.server_accept_length
    server_text = (f"server-side /server_info after /flush_cache: {server:.3f}" if server is not None
                   else f"no server-side value ({run.server_accept_skipped})" if run.server_accept_skipped
                   else "no server-side value (/server_info needs SGLang's native API)")
    # No refusal on a saturated client: the server counts tokens and verify steps, the client's timing
    # does not enter the ratio.
    if run.refusal:
        server_text += "; the load client was saturated, which slows its timings, not the server's counts"
    try:
        sample = metric_sample(run.result, key)
    except ValueError as exc:
        return Judgement(key=key, outcome="inconclusive", threshold=threshold,
                         message=f"{key}: INCONCLUSIVE — no per-request accept length ({exc}); {server_text}")
    impossible = [r for r in run.result.successful
                  if r.verify_ct and over_block(r.output_tokens or 0, r.verify_ct, block)]
    if impossible:
        first = impossible[0]
        return Judgement(key=key, outcome="fail", threshold=threshold,
                         message=f"{key}: FAIL — {len(impossible)} request(s) report more tokens than "
                                 f"their verify steps of {block} draft tokens can emit (first: request "
                                 f"{first.index}, {first.output_tokens} tokens in {first.verify_ct} steps): "
                                 "the server miscounts its tokens or its verify steps (spec_verify_ct); "
                                 f"{server_text}")
    verdict = judge_floor(name, sample, threshold, confidence=confidence_of(floors))
    return Judgement.of(key, verdict, message=f"{verdict.message}; {server_text}")


def same_load(a: LoadSpec, b: LoadSpec) -> list[str]:
    """Fields of the load shape that differ between two runs: 'concurrency 8 -> 1'."""
    da, db = a.to_dict(), b.to_dict()
    return [f"{name} {db.get(name)!r} -> {da.get(name)!r}" for name in COMPARABLE_FIELDS
            if da.get(name) != db.get(name)]


def judge_speedup(run: ServiceRun, other: ServiceRun, floor: float, *, confidence: float) -> Judgement:
    """output tok/s of ``run`` over ``other``'s (both resampled) against a floor: the same load, one host."""
    key = f"speedup_vs_{other.service}"
    if run.refusal or other.refusal:
        return refused(key, run if run.refusal else other, floor)
    diff = same_load(run.result.spec, other.result.spec)
    if diff:
        return refused(key, run, floor, why=f"{run.service} and {other.service} were not loaded the same way "
                                              f"({', '.join(diff)})")
    try:
        a, b = metric_sample(run.result, "output_tok_s"), metric_sample(other.result, "output_tok_s")
    except ValueError as exc:
        return Judgement(key=key, outcome="inconclusive", threshold=floor,
                         message=f"{key}: INCONCLUSIVE — cannot be measured: {exc}")
    name = f"speed-up {run.service} ({run.algorithm}) / {other.service} ({other.algorithm})"
    verdict = judge_ratio(name, a, b, floor, confidence=confidence)
    accept = _accept_pair(run, other)
    return Judgement.of(key, verdict, message=verdict.message + accept)


def _accept_pair(run: ServiceRun, other: ServiceRun) -> str:
    a, b = run.accept_length, other.accept_length
    if a is None:
        return ""
    return f"; accept length {a:.3f}" + (f" vs {b:.3f}" if b is not None
                                         else f" ({other.algorithm}: 1 by definition)")


def comparison_pairs(algorithms: Mapping[str, str]) -> list[tuple[str, str]]:
    """(faster, slower) service pairs worth a speed-up: each speculative one vs NONE, DDTREE vs DFLASH."""
    pairs = []
    for a, alg_a in algorithms.items():
        for b, alg_b in algorithms.items():
            if a != b and ((alg_b == "NONE" and alg_a != "NONE")
                           or (alg_a == "DDTREE" and alg_b == "DFLASH")):
                pairs.append((a, b))
    return pairs


def compare(run: ServiceRun, other: ServiceRun, *,
            confidence: float = DEFAULT_CONFIDENCE) -> Comparison | None:
    """The speed-up of ``run`` over ``other``, or None when it cannot be stated (different load, no data)."""
    if same_load(run.result.spec, other.result.spec) or run.refusal or other.refusal:
        return None
    try:
        bound = ratio_bound(metric_sample(run.result, "output_tok_s"),
                            metric_sample(other.result, "output_tok_s"), confidence=confidence)
    except ValueError:
        return None
    return Comparison(service=run.service, versus=other.service, algorithm=run.algorithm,
                      versus_algorithm=other.algorithm, point=bound.point, lower=bound.lower,
                      upper=bound.upper, confidence=confidence, concurrency=run.result.spec.concurrency,
                      accept_length=run.accept_length, versus_accept_length=other.accept_length)
