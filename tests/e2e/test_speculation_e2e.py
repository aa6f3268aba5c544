"""Speculation that really happens: smoke against refservers whose drafts are never accepted, whose /v1/models
names another model, whose verifier fell back to greedy; and NGRAM / EAGLE3 beside plain through every
generation and parity check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from e2e_helpers import write_profile
from support.pytest_runs import assert_no_crash, verdict

DECLARED = 'unaccepted_draft = "random-weight test draft: loading and losslessness, not speed"'


def test_smoke_fails_a_draft_that_is_never_accepted_and_a_renamed_model(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A random draft fails smoke's accept-length check (unless the profile declares it); a server naming another
    model on /v1/models fails the identity check; a greedy-verification fallback fails the speculation check."""
    profile = write_profile(tmp_path, "spec", {
        "working": ("DFLASH", []),
        "random": ("DFLASH", ["--random-draft"]),
        "declared": ("DFLASH", ["--random-draft"]),
        "renamed": ("NONE", ["--v1-models-id", "Qwen/Qwen3-8B"]),
        "greedy": ("DFLASH", ["--inject", "greedy-fallback"]),
        "drafted": ("DFLASH", ["--speculative-draft-attention-backend", "flashmla"]),
    }, service_extra={"declared": DECLARED})
    html = tmp_path / "spec.html"
    result = run_suite("smoke", "--host", str(profile), f"--html={html}",
                       "-k", "accept_length or consistent_model or profiles_speculation")
    assert_no_crash(result)
    text = result.stdout.str()
    failed = {line.split("::")[1].split(" ")[0] for line in text.splitlines() if line.startswith("FAILED ")}
    assert failed == {"test_accept_length[spec/random]", "test_serves_one_consistent_model[spec/renamed]",
                      "test_serves_the_profiles_speculation[spec/greedy]"}, text[-4000:]
    result.stdout.fnmatch_lines([
        "*random: no speculation in practice: accept length 1.0* on 3 greedy prompts (meta_info; * tokens in * "
        "verify steps, accept rate 0.0*) < 1.1 required by the default minimum*Likely causes: a draft model that does "
        "not match the target*random or untrained draft*"])
    result.stdout.fnmatch_lines(["*renamed*/v1/models lists [[]'Qwen/Qwen3-8B'[]]*"])
    result.stdout.fnmatch_lines(["*greedy does not serve the speculation its profile asks for: sampled requests are "
                                 "verified by greedy argmax*falling back to greedy argmax verification*"])
    data = verdict(run_suite.reports, "spec")
    assert data["services"]["working"]["speculation"]["speculative_algorithm"] == "DFLASH"
    assert data["services"]["working"]["speculation"]["speculative_num_draft_tokens"] == 8
    assert data["services"]["renamed"].get("speculation") is None  # plain: no speculation to record
    failures = {f["test"].split("::")[-1].split("@")[0]: f for f in data["failures"]}
    assert failures["test_accept_length[spec/random]"]["diagnosis"][0]["id"] == "draft-never-accepted"
    assert failures["test_serves_the_profiles_speculation[spec/greedy]"]["diagnosis"][0]["id"] == "greedy-fallback"
    assert data["metrics"]["acceptance:declared"]["mean"] < 1.1  # measured, and passed: the profile says why
    assert data["metrics"]["acceptance:working"]["mean"] > 2
    # a draft attention backend SGLang replaced: passes, with notes naming both the difference and SGLang's line
    assert data["services"]["drafted"]["speculation"]["speculative_draft_attention_backend"] == "flashinfer"
    notes = [n for n in data["notes"] if n.startswith("spec/drafted")]
    assert any("--speculative-draft-attention-backend flashmla asked" in n for n in notes), notes
    assert any("but got 'flashmla'. Falling back to 'flashinfer'" in n for n in notes), notes
    assert "speculation spec/working" in html.read_text()  # the served configuration, in the Environment table


@pytest.mark.heavy
def test_ngram_and_eagle3_beside_plain_pass_smoke_generation_and_parity(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The refserver serves NGRAM and EAGLE3 losslessly with real acceptance; every suite passes them."""
    profile = write_profile(tmp_path, "algos", {
        "plain": ("NONE", []),
        "ngram": ("NGRAM", ["--speculative-num-draft-tokens", "8"]),
        "eagle3": ("EAGLE3", ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                              "--speculative-num-draft-tokens", "8"]),
    }, parity=("plain", ["ngram", "eagle3"]))
    # kept short: one distribution parity and one concurrent parity (EAGLE3's top-k tree: the harder verify), no
    # long-prompt or GPU/env checks (nothing algorithm-specific in them)
    result = run_suite(["smoke", "generation", "parity"], "--host", str(profile), "-m", "not env and not host",
                       "-k", "not long_prompt and not (distribution_parity and ngram) and not (concurrent and ngram)")
    assert_no_crash(result)
    outcomes = result.parseoutcomes()
    # skipped: plain's speculation check, the DDTREE-vs-DFLASH acceptance test (no DDTREE here), and the chat
    # surface's forced tool calls and reasoning split, which do not apply without --tool-call-parser /
    # --reasoning-parser in a command (constrained JSON that ran to max_tokens on free whitespace is judged as a
    # prefix by xgrammar: a pass, no warning)
    assert outcomes.get("passed", 0) >= 120 and set(outcomes) - {"warnings"} == {"passed", "skipped", "deselected"}, outcomes
    skips = re.findall(r"^SKIPPED \[(\d+)\] .*: (.*)$", result.stdout.str(), re.MULTILINE)
    unexpected = [why for _, why in skips if not re.search(r"does not use speculative|DDTREE|--tool-call-parser|"
                                                           r"--reasoning-parser", why)]
    assert not unexpected and outcomes["skipped"] == sum(int(n) for n, _ in skips), skips
    data = verdict(run_suite.reports, "algos")
    assert data["services"]["ngram"]["speculation"]["speculative_algorithm"] == "NGRAM"
    assert data["services"]["eagle3"]["speculation"]["speculative_eagle_topk"] == 4
    assert data["metrics"]["acceptance:ngram"]["mean"] > 1.1
    assert data["metrics"]["acceptance:eagle3"]["mean"] > 1.5
