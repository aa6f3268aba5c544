"""`pytest --host local suites/generation suites/parity` and the refserver faults, through the real plugin.

Each test runs the real suites in a pytest subprocess against refserver processes; a fault must make
exactly the expected tests fail, with the expected message and diagnosis, within its time budget.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import write_profile
from support.pytest_runs import assert_no_crash, verdict

SEED_TEST = "test_sampling_varies_with_seed"


def _failures(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["test"].rsplit("::", 1)[1]: f for f in data["failures"]}


@pytest.mark.heavy
def test_clean_refservers_pass_generation_and_parity(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps([{"name": "extra", "text": "Roses are red, violets are"}]))
    result = run_suite(["generation", "parity"], "--host", "local", f"--parity-prompts={extra}")
    assert_no_crash(result)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 100 and set(outcomes) == {"passed", "skipped"}, outcomes
    # do not apply: the DDTREE service's structured parity pair (structured_output = false: its 20
    # structured-output cases run, checking it refuses them cleanly), forced tool calls on NONE and DDTREE
    # (2 x 2 choices x greedy/sampled x whole/sse: no --tool-call-parser) and reasoning separation and the
    # reasoned constrained answer (whole, sse) on all three (no --reasoning-parser)
    assert outcomes["skipped"] == 26, outcomes
    result.stdout.fnmatch_lines(["*dflash verdict*", "local: PASS*generation:passed*parity:passed*perf:passed*",
                                 "*ddtree: DDTREE*accept length*", "*dflash: DFLASH*accept length*"])
    data = verdict(run_suite.reports, "local")
    metrics = data["metrics"]
    for pair in ("none~dflash", "none~ddtree"):
        for kind in ("parity", "parity-concurrent"):
            fact = metrics[f"{kind}:{pair}"]
            assert (fact["prompts"], fact["exact"], fact["exact_rate"], fact["real"]) == (8, 8, 1.0, 0), fact
        distribution = metrics[f"distribution:{pair}"]
        assert distribution["outcome"] == "pass" and distribution["alpha"] == 0.001
        assert len(distribution["tests"]) == 12 and all(t["n_reference"] == 200 for t in distribution["tests"])
    assert metrics["acceptance:ddtree"]["source"] == "meta_info"
    assert len(metrics["acceptance:dflash"]["per_request"]) == 17  # 16 everyday prompts + the extra one
    assert metrics["accept_ratio:ddtree/dflash"] >= 1.0
    assert data["services"]["ddtree"]["accept_length"] >= data["services"]["dflash"]["accept_length"] >= 2.0


def test_tree_verify_bug_fails_greedy_parity_as_real_divergences(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "treebug", {"none": ("NONE", []),
                                                  "ddtree": ("DDTREE", ["--inject", "tree-verify-bug"])},
                            parity=("none", ["ddtree"]))
    result = run_suite("parity", "--host", str(profile), "-k", "greedy_parity")
    assert_no_crash(result)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*none vs treebug/ddtree: */7 prompts token-identical*real*triage by treebug/none*",
                                 "*diverges at token * (real, top-1/top-2 gap *; plain server's top logprobs there: *",
                                 "*text: …* then reference * vs compared *"])
    data = verdict(run_suite.reports, "treebug")
    fact = data["metrics"]["parity:none~ddtree"]
    assert fact["real"] >= 1 and fact["ties"] == 0 and fact["unknown"] == 0 and fact["exact_rate"] < 1
    assert all(d["gap"] > 1e-3 for d in fact["divergences"])


def test_greedy_fallback_fails_seed_variation_with_the_diagnosis(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "fallback", {"dflash": ("DFLASH", ["--inject", "greedy-fallback"])})
    result = run_suite("generation", "--host", str(profile), "-k", f"{SEED_TEST} or test_sampled_generation")
    assert_no_crash(result)
    result.assert_outcomes(failed=3, passed=7)  # the sampled requests themselves look fine
    result.stdout.fnmatch_lines(["*greedy fallback: * pairs of samples (temperature 1, seeds 500..531, /generate) "
                                 "share their first token and every such pair is identical after it*",
                                 "*The server log says: *falling back to greedy argmax verification.*"])
    failures = _failures(verdict(run_suite.reports, "fallback"))
    assert set(failures) == {f"{SEED_TEST}[fallback/dflash-{api}]" for api in ("generate", "completions", "chat")}
    assert {f["diagnosis"][0]["id"] for f in failures.values()} == {"greedy-fallback"}


def test_greedy_fallback_fails_distribution_parity_with_the_diagnosis(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "fbdist", {"none": ("NONE", []),
                                                 "dflash": ("DFLASH", ["--inject", "greedy-fallback"])},
                            parity=("none", ["dflash"]))
    result = run_suite("parity", "--host", str(profile), "-k", "distribution")
    assert_no_crash(result)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*distribution parity FAIL: the first 1..4 tokens at temperature 1; Pearson chi-square test of homogeneity "
        "per prompt and prefix length at alpha = 8.33e-05 (family-wise false-alarm rate <= 0.001*",
        "*first 2 tokens: FAIL: Pearson chi-square X2 = *",
        "*fbdist/dflash's log says: *falling back to greedy argmax verification.*"])
    failure = verdict(run_suite.reports, "fbdist")["failures"][0]
    assert failure["diagnosis"][0]["id"] == "greedy-fallback"


def test_inconclusive_distribution_parity_is_not_a_pass(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "few", {"none": ("NONE", []), "dflash": ("DFLASH", [])},
                            parity=("none", ["dflash"]))
    result = run_suite("parity", "--host", str(profile), "-k", "distribution", "--dist-samples=20")
    assert_no_crash(result)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*distribution parity INCONCLUSIVE*",
                                 "*too few samples: need at least 200 per side*",
                                 "*INCONCLUSIVE is not a pass: raise --dist-samples*"])
    data = verdict(run_suite.reports, "few")
    assert data["verdict"] == "fail" and data["layers"]["parity"]["outcome"] == "failed"


def test_sampling_crash_fails_readiness_and_blocks_generation_and_parity(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "sm120", {"none": ("NONE", []),
                                                "dflash": ("DFLASH", ["--inject", "flashinfer-sm120"])},
                            parity=("none", ["dflash"]))
    started = time.monotonic()
    result = run_suite(["generation", "parity"], "--host", str(profile), "-k", "dflash and not ddtree")
    assert_no_crash(result)
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors") == 1 and "failed" not in outcomes and "passed" not in outcomes, outcomes
    result.stdout.fnmatch_lines(["*ERROR at setup of test_greedy_generation[[]sm120/dflash-generate[]]*",
                                 "*service dflash died during readiness: first sampled generation*killed by SIGKILL*",
                                 "*[[]flashinfer-sm12x-nvcc[]]*",
                                 "*the same event also matched:*sampling-jit-first-sampled-request*"])
    assert "in top_k_top_p_sampling_from_probs" in result.stdout.str()
    data = verdict(run_suite.reports, "sm120")
    assert data["layers"]["generation"]["outcome"] == "failed"
    assert data["layers"]["parity"]["outcome"] == "blocked" and data["layers"]["perf"]["outcome"] == "blocked"
    assert time.monotonic() - started < 60


def test_truncated_stream_fails_the_stream_tests(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "trunc", {"dflash": ("DFLASH", ["--inject", "truncated-stream"])})
    started = time.monotonic()
    result = run_suite("generation", "--host", str(profile), "-k", "stream or greedy_generation")
    assert_no_crash(result)
    result.assert_outcomes(failed=3, passed=3)
    assert set(_failures(verdict(run_suite.reports, "trunc"))) == {
        f"test_streamed_generation[trunc/dflash-{api}]" for api in ("generate", "completions", "chat")}
    result.stdout.fnmatch_lines(["*streamed generation (/generate): stream ended without 'data: [[]DONE[]]' after *",
                                 "*streamed generation (/v1/chat/completions): stream ended without *"])
    assert time.monotonic() - started < 45


def test_bad_json_fails_the_first_test_and_blocks_the_rest(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "badjson", {"dflash": ("DFLASH", ["--inject", "bad-json"])})
    started = time.monotonic()
    result = run_suite("generation", "--host", str(profile), "-k", "greedy_generation or n_samples")
    assert_no_crash(result)
    result.assert_outcomes(errors=1, skipped=5)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_greedy_generation*", "*malformed JSON body*"])
    assert time.monotonic() - started < 45


def test_hung_request_fails_its_test_within_the_request_timeout(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # readiness makes 2 generations; the 3rd (the first test's) is admitted and never answered
    profile = write_profile(tmp_path, "hang", {"dflash": ("DFLASH", ["--inject", "hang=3"])})
    started = time.monotonic()
    result = run_suite("generation", "--host", str(profile), "-k", "greedy_generation or max_tokens",
                       "--request-timeout=3s")
    assert_no_crash(result)
    result.assert_outcomes(failed=1, passed=5)  # the server keeps serving everyone else
    result.stdout.fnmatch_lines(["*DeadlineExceeded: hang/dflash /generate: no HTTP response: timed out: no complete "
                                 "answer within 3s*this request alone was lost; the service is not blocked*",
                                 "FAILED *test_greedy_generation[[]hang/dflash-generate[]]*"])
    assert time.monotonic() - started < 45


def test_profile_without_plain_service_gets_one_derived_for_triage(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "derive", {"dflash": ("DFLASH", []),
                                                 "ddtree": ("DDTREE", ["--inject", "tree-verify-bug"])},
                            extra='[parity]\nreference = "dflash"\ncompare = ["ddtree"]\n')
    result = run_suite("parity", "--host", str(profile), "-k", "test_greedy_parity and not concurrent")
    assert_no_crash(result)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*derive/dflash-plain: started*",
                                 "*derive/dflash vs derive/ddtree: *real*triage by derive/dflash-plain*"])
    data = verdict(run_suite.reports, "derive")
    assert data["metrics"]["parity:dflash~ddtree"]["plain"] == "derive/dflash-plain"
    assert any("derived from dflash" in note for note in data["notes"])
