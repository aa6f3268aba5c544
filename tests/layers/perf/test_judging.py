"""The perf layer's judgements on synthetic runs: floors, accept length, speed-ups, baselines, refusals."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from perf_fakes import fake_result, fake_run

from pytest_dflash.layers.parity.acceptance import DEFAULT_MIN_ACCEPT_LENGTH
from pytest_dflash.layers.perf.baseline import baseline_path, judge_baseline, load_baseline, save_baseline
from pytest_dflash.layers.perf.judging import (
    compare,
    comparison_pairs,
    judge_accept_length,
    judge_floors,
    judge_speedup,
)
from pytest_dflash.layers.perf.report import summary_lines
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.load import LoadResult, LoadSpec


def outcomes(judgements: list[Any]) -> dict[str, str]:
    return {j.key: j.outcome for j in judgements}


def test_clear_floors_pass_and_a_slow_service_fails_with_value_bound_and_floor() -> None:
    run = fake_run()  # ~320 tok/s, TTFT 40 ms, ITL ~2 ms
    floors = {"output_tok_s": 150.0, "ttft_p50_ms": 250.0, "itl_p99_ms": 300.0}
    assert outcomes(judge_floors(run, floors)) == {"errors": "pass", "output_tok_s": "pass", "ttft_p50_ms": "pass",
                                                   "itl_p99_ms": "pass"}
    slow = fake_run(e2e_ms=800.0)  # ~40 tok/s
    judged = {j.key: j for j in judge_floors(slow, floors)}
    tput = judged["output_tok_s"]
    assert tput.outcome == "fail"
    assert tput.point is not None and tput.bound is not None and tput.point < tput.bound < 150
    assert tput.message.startswith(f"output_tok_s: FAIL — {tput.point:.4g} tok/s, 95% upper bound ")
    assert "< floor 150 tok/s" in tput.message and "(n=40 requests)" in tput.message
    assert judged["ttft_p50_ms"].outcome == "pass"  # only what is slow fails


def test_a_too_short_run_is_inconclusive_with_the_requests_that_would_decide() -> None:
    judged = {j.key: j for j in judge_floors(fake_run(n=8), {"output_tok_s": 150.0})}
    tput = judged["output_tok_s"]
    assert tput.outcome == "inconclusive"
    assert tput.more_requests == 12
    assert "INCONCLUSIVE" in tput.message and "about 12 more requests would decide" in tput.message


def test_a_straddling_run_is_inconclusive_not_pass() -> None:
    run = fake_run()
    point = run.result.metrics["output_throughput"]
    tput = next(j for j in judge_floors(run, {"output_tok_s": point}) if j.key == "output_tok_s")
    assert tput.outcome == "inconclusive"
    assert tput.lower is not None and tput.upper is not None and tput.lower < point < tput.upper


def test_failed_requests_fail_the_run_whatever_its_speed() -> None:
    judged = {j.key: j for j in judge_floors(fake_run(failed=2), {"output_tok_s": 10.0})}
    assert judged["errors"].outcome == "fail"
    assert "2 of 42 requests failed (timeout=2); first: timeout: no token within 120 s" in judged["errors"].message
    assert judged["output_tok_s"].outcome == "pass"


def test_a_saturated_client_gets_no_judgement_at_all() -> None:
    run = fake_run(saturated=True, e2e_ms=800.0)
    judged = judge_floors(run, {"output_tok_s": 150.0, "itl_p99_ms": 300.0})
    assert outcomes(judged) == {"errors": "pass", "output_tok_s": "refused", "itl_p99_ms": "refused"}
    message = judged[1].message
    assert message.startswith("output_tok_s: REFUSED — no judgement: the load client was saturated "
                              "(event-loop lag p99 80.0 ms > 5 ms)")
    assert "its numbers measure the client, not gpu-a/dflash" in message


def test_a_saturated_client_still_gets_an_accept_length_verdict() -> None:
    """The server counts accepted tokens per verify step: a slow client changes neither count."""
    run = fake_run(saturated=True, verify=8)  # 32 tokens / 8 steps = 4.0
    passed = judge_accept_length(run, {"accept_length": 3.0})
    assert passed.outcome == "pass" and passed.point == pytest.approx(4.0)
    assert "the load client was saturated, which slows its timings, not the server's counts" in passed.message
    assert judge_accept_length(run, {"accept_length": 5.0}).outcome == "fail"


def test_more_tokens_per_verify_step_than_the_draft_block_fails_the_accept_length() -> None:
    """32 tokens in 2 verify steps (accept length 16) cannot come from blocks of 8 draft tokens: a server that
    under-counts spec_verify_ct once passed any accept-length floor."""
    run = fake_run(verify=2)
    assert judge_accept_length(run, {"accept_length": 3.0}).outcome == "pass"  # the block unknown
    judged = judge_accept_length(run, {"accept_length": 3.0}, block=8)
    assert judged.outcome == "fail"
    assert ("40 request(s) report more tokens than their verify steps of 8 draft tokens can emit (first: request "
            "0, 32 tokens in 2 steps)") in judged.message
    assert judge_accept_length(fake_run(verify=4), {"accept_length": 3.0}, block=8).outcome == "pass"


def test_one_saturated_client_process_refuses_the_whole_run() -> None:
    from pytest_dflash.load.procs import merge_saturation

    calm, busy = fake_result().saturation, fake_result(saturated=True).saturation
    run = fake_run()
    run.result.saturation = merge_saturation([calm, busy, calm])
    assert run.result.client_saturated and run.result.saturation.saturated_processes == [2]
    judged = judge_floors(run, {"output_tok_s": 10.0})
    assert outcomes(judged) == {"errors": "pass", "output_tok_s": "refused"}
    message = judged[1].message
    assert "(client process 2 of 3: event-loop lag p99 80.0 ms > 5 ms)" in message
    assert "spread over 3 client processes and process(es) 2 saturated, which refuses the whole run" in message
    run.result.saturation = merge_saturation([calm, calm])
    assert run.refusal is None and run.result.saturation.processes == 2


def test_a_saturated_run_is_measured_again_and_the_clean_retry_is_judged() -> None:
    results = [fake_result(saturated=True), fake_result()]
    said: list[str] = []

    def runner(url: str, spec: LoadSpec, **kwargs: Any) -> LoadResult:
        assert kwargs["keep_token_times"] is True
        return results.pop(0)

    run = ServiceRun.measure(host="h", service="s", algorithm="DFLASH", url="http://x", native=True,
                             settings=PerfSettings(retries=1), runner=runner, say=said.append)
    assert run.attempts == 2 and run.saturated_attempts == 1 and run.refusal is None
    assert said == ["h/s: the load client was saturated (event-loop lag p99 80.0 ms > 5 ms): measuring again"]
    results[:] = [fake_result(saturated=True), fake_result(saturated=True)]
    run = ServiceRun.measure(host="h", service="s", algorithm="DFLASH", url="http://x", native=True,
                             settings=PerfSettings(retries=1), runner=runner)
    assert run.refusal is not None and "in 2 of 2 run(s)" in run.refusal


def test_accept_length_per_request_against_the_floor_with_the_server_value_alongside() -> None:
    run = fake_run(verify=8, server_accept=4.1)  # 32 tokens / 8 steps = 4.0
    j = judge_accept_length(run, {"accept_length": 3.0})
    assert j.outcome == "pass" and j.point == pytest.approx(4.0)
    assert "server-side /server_info after /flush_cache: 4.100" in j.message
    assert judge_accept_length(run, {"accept_length": 5.0}).outcome == "fail"
    assert judge_accept_length(run, {}).outcome == "pass"  # no floor: the default minimum (1.1)
    none = judge_accept_length(fake_run(verify=None), {"accept_length": 3.0})
    assert none.outcome == "inconclusive" and "no per-request accept length" in none.message


def test_accept_length_without_a_floor_needs_the_default_minimum_unless_the_draft_is_declared_unaccepted() -> None:
    """One rule with smoke and parity (issue 25): accept length 1.03 is speculation in name only, whatever the
    floor table says, unless the profile declares the draft unaccepted (then 1 token per verify step will do)."""
    run = fake_run(tokens=32, verify=31)  # 32 tokens / 31 steps = 1.032 on every request
    assert DEFAULT_MIN_ACCEPT_LENGTH == 1.1
    j = judge_accept_length(run, {}, source="hosts/x.toml")
    assert j.outcome == "fail" and j.threshold == DEFAULT_MIN_ACCEPT_LENGTH and j.point == pytest.approx(32 / 31)
    assert j.message.startswith("accept_length (no floor set: the default minimum for a speculative service (set "
                                "[floors.dflash] accept_length, or unaccepted_draft for a draft that cannot be "
                                "accepted)): FAIL")
    exempt = judge_accept_length(run, {}, unaccepted_draft="a random-weight test draft", source="hosts/x.toml")
    assert exempt.outcome == "pass" and exempt.threshold == 1.0
    assert "[services.dflash] unaccepted_draft of hosts/x.toml: a random-weight test draft" in exempt.message
    floored = judge_accept_length(run, {"accept_length": 1.0}, unaccepted_draft=None)
    assert floored.outcome == "pass" and floored.threshold == 1.0  # an explicit floor wins over the default
    assert judge_accept_length(fake_run(tokens=32, verify=40), {}, unaccepted_draft="why").outcome == "fail"


def test_speedup_is_a_ratio_of_two_runs_at_the_same_load() -> None:
    ddtree = fake_run("ddtree", "DDTREE", e2e_ms=100.0)
    none = fake_run("none", "NONE", e2e_ms=400.0, verify=None, seed=1)
    j = judge_speedup(ddtree, none, 2.0, confidence=0.95)
    assert j.key == "speedup_vs_none" and j.outcome == "pass" and j.point == pytest.approx(4.0, rel=0.1)
    assert "accept length 4.571 (NONE: 1 by definition)" in j.message
    assert judge_speedup(ddtree, none, 6.0, confidence=0.95).outcome == "fail"
    other_load = ServiceRun(host="gpu-a", service="none", algorithm="NONE", settings=PerfSettings(),
                            result=fake_result(e2e_ms=400.0, concurrency=8))
    refused = judge_speedup(ddtree, other_load, 2.0, confidence=0.95)
    assert refused.outcome == "refused" and "concurrency 8 -> 1" in refused.message


def test_comparisons_ddtree_vs_dflash_vs_none() -> None:
    pairs = comparison_pairs({"none": "NONE", "dflash": "DFLASH", "ddtree": "DDTREE"})
    assert sorted(pairs) == [("ddtree", "dflash"), ("ddtree", "none"), ("dflash", "none")]
    comparison = compare(fake_run("ddtree", "DDTREE"), fake_run("dflash", "DFLASH", seed=2))
    assert comparison is not None and comparison.lower < 1.0 < comparison.upper
    assert comparison.describe().startswith("ddtree/dflash 1.0") and "(accept length 4.57 vs 4.57)" in comparison.describe()


def test_baseline_round_trip_and_regression_with_old_and_new_numbers(tmp_path: Path) -> None:
    good = fake_run(e2e_ms=100.0)
    path = save_baseline(good, baseline_path(tmp_path, "gpu a", "dflash"))
    assert path == tmp_path / "gpu%20a" / "dflash.json"  # injective: "gpu_a" is gpu%5Fa, "gpu:a" gpu_a
    baseline = load_baseline(path)
    assert len(baseline.result.records) == 40 and baseline.recorded
    same = judge_baseline(fake_run(e2e_ms=100.0, seed=3), baseline, {"regression_pct": 10.0})
    assert outcomes(same) == {"baseline.output_tok_s": "pass", "baseline.accept_length": "pass"}
    slow_run = fake_run(e2e_ms=200.0, seed=3)
    tput = judge_baseline(slow_run, baseline, {"regression_pct": 10.0})[0]
    assert tput.outcome == "fail"
    old, new = good.result.metrics["output_throughput"], slow_run.result.metrics["output_throughput"]
    assert f"output_tok_s {old:.4g} -> {new:.4g} tok/s (-5" in tput.message
    assert "allowed regression 10%" in tput.message and f"since the baseline recorded {baseline.recorded}" in tput.message


def test_a_baseline_of_another_load_is_refused_not_compared(tmp_path: Path) -> None:
    path = save_baseline(fake_run(concurrency=8), tmp_path / "b.json")
    judged = judge_baseline(fake_run(), load_baseline(path), {})
    assert outcomes(judged) == {"baseline": "refused"}
    assert "recorded with another load (concurrency 8 -> 1)" in judged[0].message
    assert "--update-baseline" in judged[0].message


@pytest.mark.parametrize("text", ["{not json", "[" * 100_000], ids=["not-json", "nested-too-deep"])
def test_an_unreadable_baseline_names_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}: not a readable perf baseline"):
        load_baseline(path)


def test_streams_delivered_whole_leave_itl_and_tpot_unmeasured_not_passed() -> None:
    """A buffering proxy hands each stream over in one piece: every gap ~0 ms, so an ITL ceiling once passed
    ("ITL p99 0.0 ms") having seen no gap a client would. Here a slow server (20 s to the whole answer) hides
    up to 645 ms per token behind its TTFT: more than the ceilings, so nothing is known of them."""
    run = fake_run()
    for record in run.result.records:
        record.itl_ms = [0.0004] * len(record.itl_ms)
        record.ttft_ms = 20_000.0
    judged = {j.key: j for j in judge_floors(run, {"output_tok_s": 150.0, "itl_p99_ms": 300.0,
                                                   "tpot_mean_ms": 50.0})}
    for key in ("itl_p99_ms", "tpot_mean_ms"):
        assert judged[key].outcome == "inconclusive", judged[key].message
        assert "every stream was delivered whole: in each of 40 requests all tokens came within 1 ms" in \
            judged[key].message
    assert judged["output_tok_s"].outcome == "pass"
    fast = fake_run()  # ~100 ms to the whole answer: at most ~3 ms per token hidden, under every ceiling
    for record in fast.result.records:
        record.itl_ms = [0.0004] * len(record.itl_ms)
        record.ttft_ms = record.e2e_ms
    assert {j.key: j.outcome for j in judge_floors(fast, {"itl_p99_ms": 300.0})}["itl_p99_ms"] == "pass"
    one_real_gap = fake_run()
    for record in one_real_gap.result.records[1:]:
        record.itl_ms = [0.0004] * len(record.itl_ms)
    assert {j.key: j.outcome for j in judge_floors(one_real_gap, {"itl_p99_ms": 300.0})}["itl_p99_ms"] == "pass"


def _nan_e2e(doc: dict[str, Any]) -> None:
    doc["requests"][0]["e2e_ms"] = math.nan


def _no_tokens(doc: dict[str, Any]) -> None:
    for request in doc["requests"]:
        request["output_tokens"] = 0


@pytest.mark.parametrize(("edit", "said"), [
    (lambda d: d.update(duration=0), "its duration 0 is not a positive number of seconds"),
    (lambda d: d.update(duration=-5.0), "its duration -5.0 is not a positive number"),
    (_nan_e2e, "request 0: e2e_ms nan is not a finite number"),
    (_no_tokens, "its requests generated no token"),
    (lambda d: d["requests"][3].update(output_tokens=-32), "request 3: output_tokens -32"),
    (lambda d: d.update(requests=[]), "it has no successful measured request"),
], ids=["duration-0", "duration-negative", "e2e-nan", "no-tokens", "tokens-negative", "no-requests"])
def test_a_baseline_edited_to_absurd_numbers_is_refused_naming_them(tmp_path: Path, edit: Any, said: str) -> None:
    """A hand-edited or damaged baseline: a duration of 0 once dropped the throughput comparison (accept length
    alone was judged, and a 3x slower run passed); a NaN crashed the bootstrap with an IndexError."""
    path = save_baseline(fake_run(e2e_ms=100.0, seed=1), tmp_path / "b.json")
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"{path}: not a readable perf baseline \\({re.escape(said)}.*--update-baseline"):
        load_baseline(path)


def test_document_keeps_bench_serving_names_and_adds_the_judgements(tmp_path: Path) -> None:
    run = fake_run(server_accept=4.5)
    run.judge(judge_floors(run, {"output_tok_s": 100.0}))
    doc = json.loads(run.write(tmp_path / "dflash.json").read_text())
    for name in ("output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p99_itl_ms", "accept_length",
                 "completed", "duration", "request_throughput"):
        assert name in doc, name
    assert doc["accept_length"] == 4.5 and len(doc["requests"]) == 40
    meta = doc["dflash_perf"]
    assert meta["service"] == "dflash" and [j["key"] for j in meta["judgements"]] == ["errors", "output_tok_s"]
    assert LoadResult.from_json((tmp_path / "dflash.json").read_text()).metrics["completed"] == 40


def test_metrics_for_the_verdict_are_numbers_keyed_by_service() -> None:
    run = fake_run()
    run.judge(judge_floors(run, {"output_tok_s": 100.0}))
    none = fake_run("none", "NONE", e2e_ms=400.0, verify=None)
    comparison = compare(run, none)
    assert comparison is not None
    run.comparisons["none"] = comparison
    metrics = run.metrics()
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["perf.dflash.output_tok_s.pass"] == 1.0
    assert metrics["perf.dflash.speedup_vs_none"] == pytest.approx(4.0, rel=0.1)
    assert metrics["perf.dflash.accept_length"] == pytest.approx(32 / 7, rel=1e-3)


def test_summary_lines_show_numbers_outcomes_and_speedups() -> None:
    run = fake_run(server_accept=4.6)
    run.judge(judge_floors(run, {"output_tok_s": 1000.0}))
    none = fake_run("none", "NONE", e2e_ms=400.0, verify=None)
    comparison = compare(run, none)
    assert comparison is not None
    run.comparisons["none"] = comparison
    lines = summary_lines([none.summary(), run.summary()])
    assert lines[0] == "gpu-a: generate, concurrency 1, 256+128 tokens, 200 requests"
    dflash = next(line for line in lines if line.startswith("    dflash (DFLASH): "))
    # both accept lengths labelled (before: "accept length 4.57 (server 4.60)"), req/s and e2e p50/p99 there
    assert "accept length 4.57 (client; server-reported 4.60)" in dflash
    assert " req/s, " in dflash and "e2e p50/p99 " in dflash, dflash
    assert any("output_tok_s FAIL" in line for line in lines)
    assert lines[-1].startswith("    speed-up (output tok/s, same load, 95% bounds): dflash/none 4.")
