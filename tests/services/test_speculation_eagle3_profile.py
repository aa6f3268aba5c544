"""tools/device/h200-eagle3.toml (plain + EAGLE3 + STANDALONE on one H200) asks for what SGLang 0.5.17 serves, so the
service layer's speculation check passes a correct server and fails a changed one (issue 25 item 4). The rules are
SGLang 0.5.17's `_handle_eagle_family` (sglang/srt/arg_groups/speculative_hook.py): with --speculative-num-steps
given, topk and the draft tokens are not auto-chosen; topk 1 forces num_draft_tokens := num_steps + 1 (with its
warning); max_running_requests is reset to 48 (with its warning)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.services.speculation import compare, requested_speculation

PROFILE = Path(__file__).parents[2] / "tools" / "device" / "h200-eagle3.toml"
EAGLE_NGRAM = Path(__file__).parents[2] / "tools" / "device" / "h200-eagle-ngram.toml"
WARNINGS = (Path(__file__).parents[1] / "data" / "sglang-0.5.17-source" / "speculative_warnings.log").read_text()
RESET = next(line for line in WARNINGS.splitlines() if "Max running requests is reset to 48" in line)
ADJUSTED = next(line for line in WARNINGS.splitlines() if "is adjusted to" in line)


def _served_by_sglang_0_5_17(asked: dict[str, Any]) -> dict[str, Any]:
    """/server_info's speculative keys for a command asking `asked`, by SGLang 0.5.17's eagle-family rules."""
    served = {"attention_backend": "triton", "max_running_requests": 48, "disable_overlap_schedule": False, **asked}
    assert {"speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"} <= set(asked)
    if served["speculative_eagle_topk"] == 1:
        served["speculative_num_draft_tokens"] = served["speculative_num_steps"] + 1
    return served


def _command(service: str) -> list[str]:
    command: list[str] = tomllib.loads(PROFILE.read_text())["services"][service]["command"]
    return command


@pytest.mark.parametrize(("path", "declared", "accepted"), [
    (PROFILE, ("eagle3", "EAGLE3"), ("standalone", "STANDALONE")),
    (EAGLE_NGRAM, ("eagle", "EAGLE"), ("ngram", "NGRAM")),
])
def test_each_device_profile_declares_its_random_head_and_not_its_accepted_draft(
        path: Path, declared: tuple[str, str], accepted: tuple[str, str]) -> None:
    """Plain beside two speculative services: the random head declared `unaccepted_draft`, the draft that is
    really accepted (STANDALONE's exact copy, NGRAM's n-grams) not; parity compares both with plain."""
    profile = load_profile(path)
    services = profile.services
    assert {name: s.algorithm for name, s in services.items()} == {"plain": "NONE", **dict([declared, accepted])}
    assert services[declared[0]].unaccepted_draft and services[accepted[0]].unaccepted_draft is None
    assert profile.parity is not None and profile.parity.compare == (declared[0], accepted[0])
    for service in services.values():  # three servers on one GPU: 0.2 each at most, no CUDA graphs
        command = service.command
        assert command[command.index("--mem-fraction-static") + 1] == "0.2" and "--disable-cuda-graph" in command


def test_eagle3_and_standalone_ask_exactly_what_sglang_serves() -> None:
    """Every EAGLE-family setting is given and consistent: nothing adjusted, only the max_running_requests note."""
    for service, algorithm, want in (("eagle3", "EAGLE3", (3, 4, 8)), ("standalone", "STANDALONE", (3, 1, 4))):
        asked = requested_speculation(_command(service))
        assert (asked["speculative_algorithm"], asked["speculative_num_steps"], asked["speculative_eagle_topk"],
                asked["speculative_num_draft_tokens"]) == (algorithm, *want)
        served = _served_by_sglang_0_5_17(asked)
        assert served["speculative_num_draft_tokens"] == asked["speculative_num_draft_tokens"], service
        findings = compare(asked, served, RESET, algorithm=algorithm)
        assert findings.failures == [], (service, findings.failures)
        assert [n.split(";")[0] for n in findings.notes] == [
            "max_running_requests was reset for speculative decoding (set --max-running-requests to choose it)"]


def test_a_standalone_server_that_drafts_another_block_fails_and_sglangs_own_adjustment_is_a_note() -> None:
    asked = requested_speculation(_command("standalone"))
    other = {**_served_by_sglang_0_5_17(asked), "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
    findings = compare(asked, other, RESET, algorithm="STANDALONE")
    assert findings.failures == ["--speculative-num-draft-tokens 4 asked, /server_info speculative_num_draft_tokens = 8"]
    # had the profile asked 8 draft tokens with topk 1, SGLang would serve 4 and say so: a note
    wrong = {**asked, "speculative_num_draft_tokens": 8}
    findings = compare(wrong, _served_by_sglang_0_5_17(wrong), RESET + "\n" + ADJUSTED, algorithm="STANDALONE")
    assert findings.failures == [] and any("(topk 1: SGLang uses num_steps + 1)" in n for n in findings.notes)


OVERLAP = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-overlap"


def test_the_eagle_service_asks_what_sglang_serves() -> None:
    """tools/device/h200-eagle-ngram.toml: EAGLE (v1, a small top-k tree: 3 steps, topk 2, 6 draft tokens) is
    served as asked by the eagle-family rules."""
    asked = requested_speculation(load_profile(EAGLE_NGRAM).services["eagle"].command)
    assert (asked["speculative_algorithm"], asked["speculative_num_steps"], asked["speculative_eagle_topk"],
            asked["speculative_num_draft_tokens"]) == ("EAGLE", 3, 2, 6)
    findings = compare(asked, _served_by_sglang_0_5_17(asked), RESET, algorithm="EAGLE")
    assert findings.failures == []
    assert [n.split(";")[0] for n in findings.notes] == [
        "max_running_requests was reset for speculative decoding (set --max-running-requests to choose it)"]


def test_the_ngram_service_asks_what_a_real_ngram_server_served() -> None:
    """The NGRAM flags are those real SGLang 0.5.17 served on the H200 (tests/data/sglang-0.5.17-h200-overlap/):
    its recorded /server_info and log give no failure, and a server drafting another number of tokens fails."""
    import json

    served = json.loads((OVERLAP / "cold.verdict.json").read_text())["services"]["ngram"]["speculation"]
    log = (OVERLAP / "cold.ngram.server.log").read_text()
    asked = requested_speculation(load_profile(EAGLE_NGRAM).services["ngram"].command)
    findings = compare(asked, served, log, algorithm="NGRAM")
    assert findings.failures == []
    assert any(n.startswith("max_running_requests was reset") for n in findings.notes)
    findings = compare(asked, {**served, "speculative_num_draft_tokens": 12}, log, algorithm="NGRAM")
    assert findings.failures == ["--speculative-num-draft-tokens 8 asked, /server_info speculative_num_draft_tokens = 12"]
