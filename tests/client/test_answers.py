"""The client's one typed answer (client/answers.py), read from real HTTP: an error event inside an HTTP 200
stream (SGLang serving_chat's refusal) is the answer's `error`, not an exception, when the caller judges it;
whole and streamed answers of both dialects read alike."""

from __future__ import annotations

import json
from typing import Any

import pytest
from services.http_doubles import FaultProxy, Reply

from pytest_dflash.client.answers import Answer, InStreamError, api_of, streamed_answer, whole_answer
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.errors import ApiError

REFUSED = ('data: {"error": {"object": "error", "message": "Grammar-based generation (json_schema, regex, ebnf, '
           'structural_tag) is not supported when the server is launched with --grammar-backend none", "type": '
           '"BAD_REQUEST", "param": null, "code": 400}}\n\n'
           'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
           '"usage":{"prompt_tokens":0,"total_tokens":0,"completion_tokens":0}}\n\ndata: [DONE]\n\n')


def _refusing(method: str, path: str, body: Any) -> Reply | None:
    return Reply(200, REFUSED.encode(), content_type="text/event-stream") if method == "POST" else None


def test_an_error_event_in_a_200_stream_is_the_answers_error() -> None:
    with FaultProxy("http://127.0.0.1:9", _refusing) as server, InferenceClient(server.url, model="m") as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "response_format": {"type": "json_object"}}
        answer = client.answer("/v1/chat/completions", body)
        with pytest.raises(ApiError, match="error event in stream"):
            client.stream("/v1/chat/completions", body)  # a caller that does not judge it: an error, as before
    assert answer.error == InStreamError(
        "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported when the server is "
        "launched with --grammar-backend none", 400, "BAD_REQUEST")
    assert answer.done and answer.streamed and answer.finish_reason is None and answer.completion_tokens == 0


def test_whole_and_streamed_answers_of_both_dialects_read_alike() -> None:
    whole = whole_answer({"text": "abc-12", "output_ids": [1, 2], "meta_info": {
        "finish_reason": {"type": "stop", "matched": 7}, "completion_tokens": 2}}, "generate", "svc")
    streamed = streamed_answer([{"text": "abc", "output_ids": [1], "meta_info": {"finish_reason": None}},
                                {"text": "abc-12", "output_ids": [1, 2], "meta_info": {
                                    "finish_reason": {"type": "stop", "matched": 7}, "completion_tokens": 2}}],
                               "generate", done=True)
    for answer in (whole, streamed):
        assert (answer.content, answer.finish_reason, answer.matched_stop, answer.completion_tokens,
                answer.output_ids) == ("abc-12", "stop", 7, 2, (1, 2))
    chat = whole_answer({"choices": [{"message": {"content": "", "reasoning_content": "hm", "tool_calls": [
        {"id": "c", "index": 0, "type": "function", "function": {"name": "add", "arguments": "null"}}]},
        "finish_reason": "length"}], "usage": {"completion_tokens": 200}}, "chat", "svc")
    assert (chat.output, chat.finish_reason, chat.completion_tokens) == ("hm", "length", 200)
    assert [call.describe() for call in chat.tool_calls] == ["add('null')"]  # a call, not "no output at all"


def test_an_abort_keeps_its_message_and_a_bad_shape_is_one_line() -> None:
    aborted = whole_answer({"text": "{", "meta_info": {"finish_reason": {
        "type": "abort", "message": "Grammar accept_token failed"}}}, "generate", "svc")
    assert (aborted.finish_reason, aborted.finish_message) == ("abort", "Grammar accept_token failed")
    with pytest.raises(ApiError, match="message.tool_calls is a JSON object, not a list"):
        whole_answer({"choices": [{"message": {"tool_calls": {"name": "add"}}}]}, "chat", "svc")
    with pytest.raises(ValueError, match="not a generation path"):
        api_of("/v1/models")


def test_an_answer_is_frozen() -> None:
    answer = Answer("chat", "x", "stop")
    with pytest.raises(AttributeError):
        answer.content = "y"  # type: ignore[misc]
    assert json.dumps(answer.usage) == "{}"


def test_every_choice_batch_entry_logprob_and_stream_frame_is_read_here() -> None:
    """The sampler checks' `Generation` is a view of these: n choices, a /generate batch, logprobs (the prompt's
    ids from input_token_logprobs, whose first logprob is null), and how a stream was framed."""
    from pytest_dflash.client.answers import Chunk, Logprob, whole_answers
    from pytest_dflash.client.sampling import Generation

    two = whole_answers({"choices": [{"index": 0, "text": "a", "finish_reason": "length"},
                                     {"index": 1, "text": "b", "finish_reason": "stop"}],
                         "usage": {"completion_tokens": 8}}, "completions", "svc")
    assert [(g.text, g.finish_reason, g.index, g.completion_tokens) for g in map(Generation, two)] == [
        ("a", "length", 0, 8), ("b", "stop", 1, 8)]
    meta = {"finish_reason": {"type": "length"}, "completion_tokens": 1, "spec_verify_ct": 1,
            "output_token_logprobs": [[-0.5, 7, "x"]], "output_top_logprobs": [[[-0.5, 7, "x"], [-1.5, 8, None]]],
            "input_token_logprobs": [[None, 1, None], [-2.0, 2, None]]}
    batch = whole_answers([{"text": "x", "output_ids": [7], "meta_info": meta}] * 2, "generate", "svc")
    assert len(batch) == 2 and batch[0].input_ids == (1, 2)
    assert batch[0].top_logprobs == ((Logprob(-0.5, 7, "x"), Logprob(-1.5, 8)),)
    gen = Generation(batch[0])
    assert (gen.logprobs, gen.top_logprobs, gen.output_ids, gen.verify_ct) == ([(-0.5, 7)], [[(-0.5, 7), (-1.5, 8)]],
                                                                              [7], 1)
    with pytest.raises(ApiError, match="a choice is JSON null, not an object"):
        whole_answers({"choices": [{"text": "a"}, None]}, "completions", "svc")
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "h"}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {"content": "i"}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"completion_tokens": 2}}]
    framing = streamed_answer(chunks, "chat", done=True).framing
    assert framing is not None and framing.usage_last and framing.usage_chunks == 1 and framing.usage_tokens == 2
    assert framing.chunks == (Chunk(0, "h", None, "assistant"), Chunk(0, "i", "length"))
    native = streamed_answer([{"text": "a", "output_ids": [1], "meta_info": {"finish_reason": None}},
                              {"text": "ab", "output_ids": [1, 2], "meta_info": {
                                  "finish_reason": {"type": "length"}, "completion_tokens": 2}}],
                             "generate", done=True).framing
    assert native is not None and native.output_ids == ((1,), (1, 2)) and native.last_tokens == 2
    assert native.last_finish == {"type": "length"} and native.last_text == "ab"
