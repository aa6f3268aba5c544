"""Tie triage against the real H200 record: two tokens at exactly -1.6786701679229736 are a tie,
a wrong token at a confident position is a real divergence, DFLASH refuses return_logprob."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.layers.parity.greedy import (
    Candidate,
    Divergence,
    ParityReport,
    PlainServer,
    classify,
    compare_greedy,
    first_divergence,
    triage,
)

TIE = -1.6786701679229736
PROMPT = "The quick brown fox"


def _body(recorded: dict[str, Any], key: str) -> dict[str, Any]:
    body: dict[str, Any] = recorded[key]["body_json"]
    return body


def _top(recorded: dict[str, Any], position: int) -> list[Candidate]:
    step = _body(recorded, "plain/generate_logprob")["meta_info"]["output_top_logprobs"][position]
    return [Candidate(float(lp), int(token), text) for lp, token, text in step]


def _plain(recorded: dict[str, Any]) -> Callable[[dict[str, Any]], tuple[int, Any]]:
    """The recorded plain server's logprob answer, cut to the tokens asked for (it recorded 8)."""
    full = _body(recorded, "plain/generate_logprob")

    def handler(body: dict[str, Any]) -> tuple[int, Any]:
        assert body["return_logprob"] is True and body["sampling_params"]["temperature"] == 0
        if "text" not in body or body["text"] != PROMPT:
            return 400, {"error": {"message": "this replay knows one prompt"}}
        n = body["sampling_params"]["max_new_tokens"]
        assert n <= len(full["output_ids"]), "the record has 8 tokens"
        meta = dict(full["meta_info"])
        for key in ("output_token_logprobs", "output_top_logprobs"):
            meta[key] = full["meta_info"][key][:n]
        return 200, {"text": "", "output_ids": full["output_ids"][:n], "meta_info": meta}

    return handler


def test_recorded_tie_is_two_tokens_at_the_same_logprob(recorded: dict[str, Any]) -> None:
    top = _top(recorded, 4)
    assert [(c.logprob, c.token) for c in top] == [(TIE, 544), (TIE, 490)]
    # the plain server emitted 490 there: the one listed second
    assert _body(recorded, "plain/generate_logprob")["output_ids"][4] == 490


def test_divergence_at_the_recorded_tie_is_a_tie(recorded: dict[str, Any]) -> None:
    verdict = classify(490, 544, _top(recorded, 4), tie_gap=1e-3)
    assert verdict.kind == "tie" and verdict.gap == 0.0 and verdict.top12 == 0.0


def test_tie_needs_no_threshold_at_all(recorded: dict[str, Any]) -> None:
    """An exact bf16 tie has gap 0: it is a tie even with tie_gap = 0."""
    assert classify(544, 490, _top(recorded, 4), tie_gap=0.0).kind == "tie"


@pytest.mark.parametrize("position", [0, 1, 2, 3, 5, 6, 7])
def test_runner_up_at_a_confident_position_is_a_real_divergence(recorded: dict[str, Any], position: int) -> None:
    top = _top(recorded, position)
    verdict = classify(top[0].token, top[1].token, top, tie_gap=1e-3)
    assert verdict.kind == "real"
    assert verdict.gap == pytest.approx(top[0].logprob - top[1].logprob)
    assert verdict.gap is not None and verdict.gap > 1.2  # recorded gaps: 1.25 .. 6.1


def test_token_outside_the_top_k_is_real_with_a_lower_bound(recorded: dict[str, Any]) -> None:
    top = _top(recorded, 2)
    verdict = classify(772, 5, top, tie_gap=1e-3)
    assert verdict.kind == "real" and verdict.lower_bound
    assert verdict.gap == pytest.approx(-0.13498839735984802 - -3.509988307952881)
    assert "not among the top 2" in verdict.note


def test_triage_reads_the_plain_servers_logprobs_at_the_divergence(
        recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    plain = PlainServer(replay(_plain(recorded)))
    reference = _body(recorded, "plain/generate_logprob")["output_ids"]
    compared = [*reference[:4], 544, 703, 601]  # took the other tied token (as DFLASH's sampled run did)
    assert triage(plain, PROMPT, reference, compared, 4, 1e-3).kind == "tie"
    wrong = [*reference[:2], 996, 1, 2]  # 996: the runner-up at a position with a 3.4 gap
    verdict = triage(plain, PROMPT, reference, wrong, 2, 1e-3)
    assert verdict.kind == "real" and verdict.gap == pytest.approx(3.375, abs=1e-3)


def test_triage_checks_the_plain_servers_own_prefix_first(
        recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    """The reference took the tied 544 at token 4 and the compared service diverges later, at token 6:
    the plain server's logprobs at 6 are about another context. The departure at 4 is a tie, and the
    record has no prompt token ids (input_token_logprobs is []) to re-read token 6: untriaged."""
    plain = PlainServer(replay(_plain(recorded)))
    own = _body(recorded, "plain/generate_logprob")["output_ids"]
    reference = [*own[:4], 544, 703, 601, 77]
    compared = [*own[:4], 544, 703, 9, 9]
    verdict = triage(plain, PROMPT, reference, compared, 6, 1e-3)
    assert verdict.kind == "unknown"
    assert "departs from the plain server's greedy output at token 4" in verdict.note and "a tie" in verdict.note


def test_reference_departing_at_a_confident_position_is_real(
        recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    plain = PlainServer(replay(_plain(recorded)))
    own = _body(recorded, "plain/generate_logprob")["output_ids"]
    reference = [own[0], 346, 1, 2, 3, 4, 5]  # 346 at token 1: 4.5 below the top
    compared = [own[0], 346, 1, 2, 3, 9, 9]
    verdict = triage(plain, PROMPT, reference, compared, 5, 1e-3)
    assert verdict.kind == "real" and "departs from the plain server's greedy output at token 1" in verdict.note


def test_dflash_refusing_return_logprob_leaves_the_divergence_untriaged(
        recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    refusal = recorded["dflash_graph/generate_logprob"]
    assert refusal["status"] == 400
    server = PlainServer(replay(lambda body: (refusal["status"], refusal["body_json"])))
    verdict = triage(server, PROMPT, [1, 2, 3], [1, 2, 4], 2, 1e-3)
    assert verdict.kind == "unknown"
    assert "DFLASH speculative decoding does not support return_logprob yet." in verdict.note


@pytest.mark.parametrize(("probe", "index"), [("generate_greedy_1", 30), ("generate_ignore_eos_128", 33),
                                              ("concurrent_0", 2), ("concurrent_2", None), ("concurrent_4", 26),
                                              ("concurrent_6", 33)])
def test_first_divergence_of_the_recorded_dflash_runs(recorded: dict[str, Any], probe: str, index: int | None) -> None:
    plain = _body(recorded, f"plain/{probe}")["output_ids"]
    dflash = _body(recorded, f"dflash_graph/{probe}")["output_ids"]
    assert first_divergence(plain, dflash) == index


def test_graphs_off_matched_for_128_tokens(recorded: dict[str, Any]) -> None:
    assert first_divergence(_body(recorded, "plain/generate_ignore_eos_128")["output_ids"],
                            _body(recorded, "dflash_nograph/generate_ignore_eos_128")["output_ids"]) is None


def test_strict_prefix_counts_as_a_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([], []) is None


def test_compare_greedy_counts_ties_and_reports_context(
        recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    """End to end: the reference answers the recorded greedy ids, the compared one takes the tied token."""
    own = _body(recorded, "plain/generate_logprob")

    def server(ids: list[int], text: str) -> Callable[[dict[str, Any]], tuple[int, Any]]:
        def handler(body: dict[str, Any]) -> tuple[int, Any]:
            meta = {"finish_reason": {"type": "length", "length": 8}, "completion_tokens": 8}
            return 200, {"text": text, "output_ids": ids, "meta_info": meta}
        return handler

    reference = replay(server(own["output_ids"], own["text"]), service="local/none")
    compared = replay(server([*own["output_ids"][:4], 544, 1, 2, 3], " quiro wXYZ"), service="local/dflash")
    report = compare_greedy(reference, compared, [PROMPT], max_tokens=8, plain=replay(_plain(recorded)),
                            max_tie_rate=0.0)
    assert report.prompts == 1 and report.exact == 0 and len(report.ties) == 1 and not report.real
    tie = report.ties[0]
    assert tie.index == 4 and tie.gap == 0.0
    assert "(tie, top-1/top-2 gap 0" in tie.describe()
    assert "544: -1.67867" in tie.describe() and "490: -1.67867" in tie.describe()
    assert "then reference 'eat' vs compared 'XYZ'" in tie.context()
    # one tie in one prompt is a tie rate of 1 > 0 allowed
    assert report.problems() == ["1 of 1 prompts diverged at numerical ties or noise: tie rate 1.00 > max_tie_rate 0"]


def test_real_divergence_message_names_the_gap() -> None:
    divergence = Divergence("The quick brown fox", 2, (929, 364, 772), (929, 364, 996), gap=3.375, kind="real",
                            top12=3.375, candidates=(Candidate(-0.135, 772), Candidate(-3.51, 996)))
    text = divergence.describe()
    assert "diverges at token 2 (real, top-1/top-2 gap 3.38, diverging token 3.38 below the top logprob)" in text
    report = ParityReport(prompts=4, exact=3, divergences=[divergence], label="none vs ddtree")
    assert report.problems() == [text]
    assert "3/4 prompts token-identical (exact-match rate 0.75); divergences: 1 real" in report.summary()
