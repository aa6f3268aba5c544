"""Accept length per request from recorded DFLASH meta_info, the /server_info fallback, DDTREE vs DFLASH."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.loader import profile_from_dict
from pytest_dflash.errors import InventoryError
from pytest_dflash.evidence.diagnosis import diagnose
from pytest_dflash.layers.parity.acceptance import (
    DEFAULT_MIN_ACCEPT_LENGTH,
    Acceptance,
    AcceptanceUnavailable,
    check_accepts_drafts,
    check_at_least_one,
    check_ddtree_vs_dflash,
    measure,
    required_floor,
)


def test_per_request_accept_length_is_sglangs(recorded: dict[str, Any],
                                              replay: Callable[..., InferenceClient]) -> None:
    body = recorded["dflash_graph/generate_greedy_2"]["body_json"]
    meta = body["meta_info"]
    result = measure(replay(lambda _: (200, body)), ["a", "b", "c"], max_tokens=32)
    assert result.source == "meta_info" and result.per_request == [meta["spec_accept_length"]] * 3
    assert (result.tokens, result.steps) == (3 * meta["completion_tokens"], 3 * meta["spec_verify_ct"])
    assert result.mean == pytest.approx(1.032, abs=1e-3)  # the H200 record: random draft, 32 tokens in 31 steps
    check_at_least_one(result)


def test_without_per_request_fields_the_server_average_after_a_flush_is_used(
        recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    body = recorded["dflash_graph/generate_greedy_2"]["body_json"]
    old = {**body, "meta_info": {k: v for k, v in body["meta_info"].items() if not k.startswith("spec_")}}
    flushes: Iterator[tuple[int, Any]] = iter([(400, "Cache not flushed: requests running"),
                                               (200, "Cache flushed.\nPlease check backend logs for more details.")])
    client = replay(lambda _: (200, old), routes={
        "/flush_cache": lambda: next(flushes),
        "/server_info": lambda: (200, {"internal_states": [{"avg_spec_accept_length": 2.75}]}),
    })
    result = measure(client, ["a", "b"], max_tokens=32)
    assert (result.source, result.mean, result.tokens) == ("server_info", 2.75, 64)


def test_no_accept_length_anywhere_is_named(replay: Callable[..., InferenceClient], recorded: dict[str, Any]) -> None:
    plain = recorded["plain/generate_greedy_1"]["body_json"]
    client = replay(lambda _: (200, plain), routes={"/flush_cache": lambda: (200, "Cache flushed."),
                                                    "/server_info": lambda: (200, {"internal_states": [{}]})})
    with pytest.raises(AcceptanceUnavailable, match="no accept length: meta_info has no spec_verify_ct"):
        measure(client, ["a"], max_tokens=32)


def test_ddtree_below_dflash_fails_with_both_numbers() -> None:
    ddtree = Acceptance("local/ddtree", "meta_info", 2, tokens=128, steps=32, per_request=[4.0, 4.0])
    dflash = Acceptance("local/dflash", "meta_info", 2, tokens=128, steps=30, per_request=[4.57, 4.0])
    with pytest.raises(AssertionError, match=r"local/ddtree 4.000 vs local/dflash 4.267 tokens per verify step "
                                             r"\(ratio 0.938\)"):
        check_ddtree_vs_dflash(ddtree, dflash, ratio=1.0)
    check_ddtree_vs_dflash(ddtree, dflash, ratio=0.9)


# ---- no speculation in name only: the default minimum, a declared unaccepted draft, a server without spec_* ----

RUN_2026_12_02 = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h200-2026-12-02"


def _recorded_acceptance(verdict: str, service: str) -> Acceptance:
    """The accept length a real H200 run measured, rebuilt from its verdict's metrics."""
    fact = json.loads((RUN_2026_12_02 / verdict).read_text())["metrics"][f"acceptance:{service}"]
    return Acceptance(f"h200/{service}", fact["source"], fact["prompts"], tokens=fact["tokens"],
                      steps=fact["verify_steps"], per_request=fact["per_request"])


def test_the_recorded_random_draft_fails_the_default_minimum_naming_numbers_and_causes() -> None:
    """The real DFLASH service of tools/device/h200.toml (random draft): 192 tokens in 189 verify steps."""
    random_draft = _recorded_acceptance("h200-all-suites.verdict.json", "dflash")
    floor = required_floor("dflash", {}, unaccepted_draft=None, source="h200.toml")
    assert floor.value == DEFAULT_MIN_ACCEPT_LENGTH == 1.1
    with pytest.raises(AssertionError) as info:
        check_accepts_drafts(random_draft, floor)
    message = str(info.value)
    assert "h200/dflash: no speculation in practice: accept length 1.016 on 3 greedy prompts (meta_info; 192 tokens " \
           "in 189 verify steps) < 1.1 required by the default minimum" in message
    for cause in ("does not match the target", "random or untrained draft", "disabled by a fallback"):
        assert cause in message


def test_a_declared_unaccepted_draft_or_an_explicit_floor_lets_the_same_numbers_pass() -> None:
    random_draft = _recorded_acceptance("h200-all-suites.verdict.json", "dflash")
    declared = required_floor("dflash", {}, unaccepted_draft="random test draft", source="h200.toml")
    assert declared.value == 1.0 and "random test draft" in declared.where
    check_accepts_drafts(random_draft, declared)
    explicit = required_floor("dflash", {"accept_length": 1.01}, unaccepted_draft=None, source="h200.toml")
    check_accepts_drafts(random_draft, explicit)
    with pytest.raises(AssertionError, match=r"< 2.5 required by \[floors.dflash\] accept_length of h200.toml"):
        check_accepts_drafts(random_draft, required_floor("dflash", {"accept_length": 2.5}, unaccepted_draft="x",
                                                          source="h200.toml"))


def test_the_recorded_ngram_service_passes_the_default_minimum() -> None:
    """Real NGRAM on the H200 accepted 4.8 tokens per verify step: well above the default minimum."""
    check_accepts_drafts(_recorded_acceptance("ngram.verdict.json", "ngram"),
                         required_floor("ngram", {}, unaccepted_draft=None, source="h200-ngram.toml"))


def test_accept_rate_zero_is_named(recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    """meta_info's draft counts (spec_num_correct_drafts / spec_num_proposed_drafts) give the accept rate."""
    body = recorded["dflash_graph/generate_greedy_2"]["body_json"]
    meta = {**body["meta_info"], "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 15 * 31,
            "spec_verify_ct": 32}
    result = measure(replay(lambda _: (200, {**body, "meta_info": meta})), ["a"], max_tokens=32)
    assert result.accept_rate == 0.0 and result.as_fact()["accept_rate"] == 0.0
    with pytest.raises(AssertionError, match=r"accept length 1.000 .*accept rate 0.000\).*reports accept rate 0 "
                                             r"\(0 of 465 draft tokens accepted\)"):
        check_accepts_drafts(result, required_floor("d", {}, unaccepted_draft=None, source="p"))


def test_a_speculative_server_with_no_spec_fields_anywhere_fails_even_without_a_flush(
        recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    """A plain server's answers (no spec_* in meta_info, no avg_spec_accept_length in /server_info) for a
    speculative profile: not speculating. No /flush_cache is needed to see it, so it fails instead of skipping."""
    plain = recorded["plain/generate_greedy_1"]["body_json"]
    client = replay(lambda _: (200, plain), routes={"/server_info": lambda: (200, {"internal_states": [{}]})})
    with pytest.raises(AcceptanceUnavailable, match="the server is not speculating.*Likely causes"):
        measure(client, ["a"], max_tokens=32, flush_refused="attached server, no --allow-state-changes")


def _profile(**service: Any) -> dict[str, Any]:
    return {"host": {"connection": "local://"},
            "services": {"dflash": {"kind": "process", "command": ["x"], **service}}}


def test_unaccepted_draft_is_a_reason_on_a_speculative_service() -> None:
    spec = profile_from_dict(_profile(algorithm="DFLASH", unaccepted_draft="random test draft"),
                             source=Path("p.toml")).services["dflash"]
    assert spec.unaccepted_draft == "random test draft"
    with pytest.raises(InventoryError, match=r"services.dflash.unaccepted_draft.*only for a service with a "
                                             "speculative algorithm"):
        profile_from_dict(_profile(algorithm="NONE", unaccepted_draft="why"), source=Path("p.toml"))
    with pytest.raises(InventoryError, match=r"unaccepted_draft.*expected the reason"):
        profile_from_dict(_profile(algorithm="DFLASH", unaccepted_draft=" "), source=Path("p.toml"))


def test_the_catalog_names_a_draft_that_is_never_accepted_only_with_the_failure() -> None:
    """The real random-draft log diagnoses as draft-never-accepted beside the accept-length failure; the same log
    of a healthy run (a declared random draft) diagnoses as nothing."""
    log = (RUN_2026_12_02 / "h200.dflash.server.log").read_text()
    random_draft = _recorded_acceptance("h200-all-suites.verdict.json", "dflash")
    with pytest.raises(AssertionError) as info:
        check_accepts_drafts(random_draft, required_floor("dflash", {}, unaccepted_draft=None, source="h200.toml"))
    found = diagnose(str(info.value), log)
    assert found[0].id == "draft-never-accepted" and "accept len: 1.00, accept rate: 0.00" in found[0].evidence
    assert [d.id for d in diagnose(log)] == []


def test_a_working_draft_below_an_explicit_floor_is_not_called_no_speculation() -> None:
    """Real NGRAM (4.8) under a floor of 6: drafts are accepted, just less often than the profile requires."""
    ngram = _recorded_acceptance("ngram.verdict.json", "ngram")
    with pytest.raises(AssertionError, match=r"h200/ngram: drafts accepted less often than required: accept length "
                                             r"4.785 on 16 greedy prompts .* < 6 required by \[floors.ngram\]"):
        check_accepts_drafts(ngram, required_floor("ngram", {"accept_length": 6}, unaccepted_draft=None, source="p"))


def test_a_request_reporting_more_tokens_than_it_allowed_fails(recorded: dict[str, Any],
                                                                replay: Callable[..., InferenceClient]) -> None:
    """The accept length is completion_tokens / spec_verify_ct: a server that over-counts its tokens (3x) once
    passed any floor with an accept length no step could emit."""
    body = recorded["dflash_graph/generate_greedy_2"]["body_json"]
    honest = body["meta_info"]["completion_tokens"]
    meta = {**body["meta_info"], "completion_tokens": 3 * honest}
    result = measure(replay(lambda _: (200, {**body, "meta_info": meta})), ["a"], max_tokens=honest)
    floor = required_floor("d", {}, unaccepted_draft="the recording's random draft", source="p")
    with pytest.raises(AssertionError, match=f"replay: a request of at most {honest} tokens reports {3 * honest} "
                                             "completion tokens \\(meta_info\\)"):
        check_accepts_drafts(result, floor)
    check_accepts_drafts(measure(replay(lambda _: (200, body)), ["a"], max_tokens=honest), floor, block=16)


def test_more_tokens_per_verify_step_than_the_block_fails() -> None:
    """A verify step of N draft tokens emits at most N (plus the prefill's token, once per request): a server
    that under-counts spec_verify_ct reports an accept length no step could reach."""
    floor = required_floor("d", {}, unaccepted_draft=None, source="p")
    possible = Acceptance("d", "meta_info", prompts=2, tokens=2 * 8 * 4 + 2, steps=8)
    check_accepts_drafts(possible, floor, block=8)
    impossible = Acceptance("d", "meta_info", prompts=2, tokens=2 * 8 * 4 + 3, steps=8)
    check_accepts_drafts(impossible, floor)  # the block unknown: nothing to compare with
    with pytest.raises(AssertionError, match=r"d: 67 tokens in 8 verify steps on 2 prompts \(accept length "
                                             r"8\.375\) is more than steps of 8 draft tokens can emit"):
        check_accepts_drafts(impossible, floor, block=8)
