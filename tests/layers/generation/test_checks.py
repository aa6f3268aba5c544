"""Generation-layer checks against real SGLang 0.5.17 responses (recorded on an H200) and their breakages."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling, Stream
from pytest_dflash.layers.generation.bad_requests import bad_request, bad_request_body
from pytest_dflash.layers.generation.checks import pick_stop_string
from pytest_dflash.layers.generation.requests import Api
from pytest_dflash.layers.generation.seeds import SeedVariation, check_seed_variation
from pytest_dflash.layers.generation.shapes import check_full_length, check_stream

PROBES = {"generate": "generate_stream", "completions": "completions_stream", "chat": "chat_completions_stream"}


def _stream(record: dict[str, Any]) -> Stream:
    """The recorded SSE lines as the client parses them (data: lines, [DONE])."""
    events = [json.loads(line[5:]) for line in record["sse_lines"] if line.startswith("data:") and "[DONE]" not in line]
    done = any(line.strip() == "data: [DONE]" for line in record["sse_lines"])
    return Stream(events, [0.01 * i for i in range(len(events))], done, list(record["sse_lines"]), 0.1, 200,
                  record["headers"]["content-type"])


def _request(record: dict[str, Any]) -> int:
    body = record["request"]
    return int(body.get("max_tokens") or body["sampling_params"]["max_new_tokens"])


@pytest.mark.parametrize("server", ["plain", "dflash_graph"])
@pytest.mark.parametrize("api", list(PROBES))
def test_recorded_sglang_streams_pass(recorded: dict[str, Any], server: str, api: str) -> None:
    record = recorded[f"{server}/{PROBES[api]}"]
    check = check_stream(_stream(record), native=api == "generate", max_tokens=_request(record),
                                    what=api, chat=api == "chat")
    assert check.tokens == _request(record)


@pytest.mark.parametrize(("api", "breakage", "message"), [
    ("generate", "no-done", "stream ended without 'data: [DONE]'"),
    ("completions", "no-done", "stream ended without 'data: [DONE]'"),
    ("generate", "ids-rewritten", "do not extend the previous"),
    ("generate", "no-finish", "last event has no finish_reason"),
    ("completions", "no-usage", "no final usage chunk"),
    ("chat", "finish-twice", "finish_reason must come once, on the last choice chunk"),
    ("chat", "content-type", "content-type 'application/json', expected text/event-stream"),
    ("completions", "usage-overflow", "usage.completion_tokens = 999"),
])
def test_broken_streams_fail_with_the_reason(recorded: dict[str, Any], api: str, breakage: str, message: str) -> None:
    record = recorded[f"plain/{PROBES[api]}"]
    stream = _stream(record)
    events = copy.deepcopy(stream.events)
    if breakage == "no-done":
        stream = Stream(events[: len(events) // 2], stream.arrival_s[: len(events) // 2], False, stream.raw_lines[:6],
                        0.1, 200, stream.content_type)
    elif breakage == "ids-rewritten":
        events[3]["output_ids"] = [7, 7, 7, 7]
    elif breakage == "no-finish":
        events[-1]["meta_info"]["finish_reason"] = None
    elif breakage == "no-usage":
        events = [e for e in events if not (e.get("usage") and not e.get("choices"))]
    elif breakage == "finish-twice":
        events[2]["choices"][0]["finish_reason"] = "length"
    elif breakage == "usage-overflow":
        events[-1]["usage"]["completion_tokens"] = 999
    content_type = "application/json" if breakage == "content-type" else stream.content_type
    stream = Stream(events, stream.arrival_s[: len(events)], stream.done, stream.raw_lines, 0.1, 200, content_type)
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_stream(stream, native=api == "generate", max_tokens=_request(record), what=api,
                                chat=api == "chat")


def _variation(outputs: list[tuple[int, ...]], *, native: bool = True) -> SeedVariation:
    texts = ["".join(chr(65 + t % 26) for t in ids) for ids in outputs]
    return SeedVariation(list(range(500, 500 + len(outputs))), texts, outputs if native else None)


def _greedy_continuation(first: list[int]) -> list[tuple[int, ...]]:
    return [(t, (t * 7) % 13, (t * 3) % 11, 5) for t in first]


FALLBACK_LINE = ("[2026-11-30 05:02:25] DFLASH non-greedy verification is unavailable on this build/device; falling "
                 "back to greedy argmax verification.")


def test_sampled_first_token_with_greedy_continuation_is_greedy_fallback() -> None:
    variation = _variation(_greedy_continuation([1, 2, 1, 3, 2, 1, 4, 2]))
    with pytest.raises(AssertionError, match="greedy fallback: 6 pairs of samples .* share their first token") as info:
        check_seed_variation(variation, api="generate", log_line=lambda: FALLBACK_LINE)
    assert "The server log says: " + FALLBACK_LINE in str(info.value)


def test_without_the_log_line_the_message_says_sampling_is_not_sampling() -> None:
    variation = _variation(_greedy_continuation([1, 2, 1, 3, 2, 1, 4, 2]))
    with pytest.raises(AssertionError, match="sampling is not sampling") as info:
        check_seed_variation(variation, api="generate", log_line=lambda: None)
    assert "falling back to greedy argmax" not in str(info.value)  # it would trigger the wrong diagnosis


def test_identical_outputs_for_every_seed_fail() -> None:
    with pytest.raises(AssertionError, match="all 6 samples .* are identical"):
        check_seed_variation(_variation([(1, 2, 3)] * 6), api="completions", log_line=lambda: None)


def test_text_only_flavours_see_repeated_outputs() -> None:
    variation = _variation(_greedy_continuation([1, 2, 1, 3, 2, 1, 4, 2]), native=False)
    with pytest.raises(AssertionError, match="6 pairs of samples .* are identical throughout"):
        check_seed_variation(variation, api="chat", log_line=lambda: None)


def test_real_sampling_passes_even_when_first_tokens_repeat() -> None:
    outputs: list[tuple[int, ...]] = [(1, 5, 6, 7), (1, 5, 6, 8), (2, 1, 1, 1), (1, 9, 9, 9), (2, 1, 1, 2), (3, 3, 3, 3)]
    for native in (True, False):
        check_seed_variation(_variation(outputs, native=native), api="generate", log_line=lambda: None)


def test_too_few_shared_first_tokens_is_no_evidence() -> None:
    check_seed_variation(_variation(_greedy_continuation([1, 2, 3, 1, 4])), api="generate",
                                    log_line=lambda: None)  # one shared pair: could be chance


@pytest.mark.parametrize(("text", "stop"), [(" quiro weat hello", "ro"), ("ab\ufffd\ufffdxyzxyz", "xy"),
                                            ("tiny", None)])
def test_stop_string_is_taken_from_well_inside_the_text(text: str, stop: str | None) -> None:
    assert pick_stop_string(text) == stop


def test_bad_requests_are_what_sglang_rejects(replay: Callable[..., InferenceClient]) -> None:
    client = replay(lambda body: (200, {}))
    client._model = "default"
    body = bad_request_body(client, "generate", "top_p=1.5", context_tokens=4096)
    assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 4, "top_p": 1.5}
    body = bad_request_body(client, "completions", "prompt over the context", context_tokens=4096)
    assert len(body["prompt"]) > 8192 and body["max_tokens"] == 4
    assert "messages" not in bad_request_body(client, "chat", "chat without messages", context_tokens=None)
    assert bad_request_body(client, "chat", "max_tokens=-1", context_tokens=None)["max_tokens"] == -1


def test_recorded_error_bodies_are_4xx_with_a_message(recorded: dict[str, Any],
                                                       replay: Callable[..., InferenceClient]) -> None:
    cases: list[tuple[str, Api, str]] = [("err_bad_temperature", "generate", "temperature=-1"),
                                         ("err_chat_no_messages", "chat", "chat without messages")]
    for probe, api, case in cases:
        record = recorded[f"plain/{probe}"]
        client = replay(lambda body, r=record: (r["status"], r["body_json"]))
        client._model = "default"
        assert bad_request(client, api, case, context_tokens=4096) == 400


def test_a_5xx_for_a_bad_request_fails(replay: Callable[..., InferenceClient]) -> None:
    client = replay(lambda body: (500, {"error": {"message": "Internal Server Error"}}))
    with pytest.raises(AssertionError, match=r"bad request \[top_k=0\] to /generate answered HTTP 500, expected 4xx"):
        bad_request(client, "generate", "top_k=0", context_tokens=None)


def test_full_length_check_counts_openai_choices() -> None:
    from pytest_dflash.client.answers import Answer
    from pytest_dflash.client.sampling import Generation

    sampling = Sampling(max_tokens=4, n=2, ignore_eos=True)
    gens = [Generation(Answer("completions", "a", "length", completion_tokens=8, index=i)) for i in range(2)]
    check_full_length(gens, sampling, what="n=2")
    gens[1] = Generation(Answer("completions", "a", "stop", completion_tokens=8, index=1))
    with pytest.raises(AssertionError, match=r"n=2 \(sample 1\): finish_reason 'stop' with ignore_eos"):
        check_full_length(gens, sampling, what="n=2")
