"""Structured-output validation: each grammar's language, finish reasons, streams, the disabled backend, the
constrained answer after the reasoning, and forced tool calls whole and put together from a stream."""

from __future__ import annotations

import importlib.util
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_dflash.client.answers import Answer, ToolCall, stream_tokens, streamed_answer, whole_answer
from pytest_dflash.layers.generation.chat_surface import check_reasoned, check_tool_calls
from pytest_dflash.layers.generation.structured import (
    EBNF,
    GRAMMARS,
    backend_disabled,
    check_outcome,
    ebnf_accepts,
)
from pytest_dflash.services.served import served_config


def Outcome(text: str, reason: str | None, *, done: bool = True, message: str | None = None,
            tokens: int | None = None) -> Answer:
    """A constrained answer as the client reads it (client/answers.py)."""
    return Answer("generate", text, reason, message, done=done, completion_tokens=tokens)


def ReasonedAnswer(reasoning: str | None, content: str, reason: str | None, *,
                   done: bool = True, tokens: int | None = None) -> Answer:
    return Answer("chat", content, reason, reasoning=reasoning, done=done, completion_tokens=tokens)


def reasoned_answer(data: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None, *,
                    done: bool = True) -> Answer:
    if data is not None:
        return whole_answer(data, "chat", "svc")
    return streamed_answer(events or [], "chat", done=done)


def tool_call_answer(choice: dict[str, Any]) -> Answer:
    return whole_answer({"choices": [{"index": 0, **choice}], "usage": choice.get("usage")}, "chat", "svc")


def streamed_tool_calls(events: list[dict[str, Any]], *, done: bool) -> Answer:
    return streamed_answer(events, "chat", done=done)


def streamed_outcome(events: list[dict[str, Any]], api: str, *, done: bool) -> Answer:
    return streamed_answer(events, "chat" if api == "chat" else "generate", done=done)


@pytest.mark.parametrize(
    ("grammar", "text", "problem"),
    [
        ("json_schema", '{"name": "ab", "age": 3}', None),
        ("json_schema", '{"name": "a\x08b", "age": 3}', None),  # raw control characters: xgrammar lets them in
        ("json_schema", '{"name": "ab"}', "breaks the schema: 'age' is a required property"),
        ("json_schema", '{"name": "ab", "age": 3', "not JSON"),
        ("json_object", "[1]", "breaks the schema"),
        ("regex", "abc-12", None),
        ("regex", "abc-123", "does not fully match"),
        ("ebnf", "maybe.", None),
        ("ebnf", "maybe", "not in the EBNF grammar's language"),
    ],
)
def test_problem_names_what_is_wrong(grammar: str, text: str, problem: str | None) -> None:
    found = GRAMMARS[grammar].problem(text)
    assert found is None if problem is None else found is not None and found.startswith(problem), found


@pytest.mark.parametrize("text", ["yes.", "no.", "maybe.", "yes", "yes..", "Yes.", "", "no.no."])
def test_ebnf_matcher_and_its_regex_agree(text: str) -> None:
    """Without xgrammar the EBNF case falls back to its regex: both must accept the same strings."""
    pytest.importorskip("xgrammar")
    pattern = GRAMMARS["ebnf"].pattern
    assert pattern is not None

    assert ebnf_accepts(EBNF, text) is (re.fullmatch(pattern, text) is not None)


def test_a_length_finish_is_judged_as_a_prefix() -> None:
    """A cut output that a real matcher calls a prefix of the language passes (judged, not warned about)."""
    pytest.importorskip("xgrammar")
    check_outcome(Outcome('{"name": "a', "length", tokens=8), GRAMMARS["json_schema"], what="svc", max_tokens=8)


@pytest.mark.parametrize(
    ("grammar", "prefix", "outside"),
    [
        ("json_schema", '{ "name" : "ab", "ag', 'The quick {"name"'),
        ("json_object", '{"k": [1, ', "[1, 2"),
        ("regex", "ab", "ab-"),
        ("ebnf", "may", "maybe.."),
        ("response_format", '{"name": "x", "age": 12', '{"name": "x", "age": "12'),
    ],
)
def test_a_length_finish_outside_the_language_fails(grammar: str, prefix: str, outside: str) -> None:
    """Cut by max_tokens, the output can only be asked to be a prefix of the language: xgrammar's matcher
    says whether it is one. A prefix passes; text no grammar could have produced fails."""
    pytest.importorskip("xgrammar")
    check_outcome(Outcome(prefix, "length", tokens=8), GRAMMARS[grammar], what="svc", max_tokens=8)
    with pytest.raises(AssertionError, match="svc: finished by length .* is not even a prefix"):
        check_outcome(Outcome(outside, "length", tokens=8), GRAMMARS[grammar], what="svc", max_tokens=8)


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        (Outcome('{"na', "abort", message="Grammar accept_token failed"),
         r"svc: finish_reason 'abort' \(Grammar accept_token failed\) after"),
        (Outcome('{"na', "stop", done=False), "the stream stopped without \\[DONE\\]"),
        (Outcome('{"name": 1, "age": 2}', "stop"), "breaks the schema"),
        (Outcome("x", None), "finish_reason None"),
    ],
)
def test_abort_truncation_and_invalid_output_fail(outcome: Outcome, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_outcome(outcome, GRAMMARS["json_schema"], what="svc", max_tokens=8)


def test_streamed_outcomes_of_both_dialects() -> None:
    native = [{"text": '{"a"', "meta_info": {"finish_reason": None}},
              {"text": '{"a": 1}', "meta_info": {"finish_reason": {"type": "stop", "matched": 256}}}]
    got = streamed_outcome(native, "generate", done=True)
    assert (got.content, got.finish_reason, got.matched_stop, got.done) == ('{"a": 1}', "stop", 256, True)
    chat = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"delta": {"content": '{"a"'}, "finish_reason": None}]},
            {"choices": [{"delta": {"content": ": 1}"}, "finish_reason": "stop"}]}]
    got = streamed_outcome(chat, "chat", done=False)
    assert (got.content, got.finish_reason, got.done) == ('{"a": 1}', "stop", False)


@pytest.mark.parametrize(
    ("command", "server_info", "said"),
    [
        (("python", "-m", "sglang.launch_server", "--grammar-backend", "none"), None,
         "its command has `--grammar-backend none`"),
        (("python", "-m", "sglang.launch_server", "--grammar-backend=none"), None,
         "its command has `--grammar-backend none`"),
        (("python", "-m", "sglang.launch_server", "--grammar-backend", "xgrammar"), None, None),
        (("python", "-m", "sglang.launch_server"), None, None),
        # attached (no command), or a DDTREE server that turns the backend off itself: /server_info says it
        ((), {"grammar_backend": "none"}, "its /server_info says grammar_backend = none"),
        (("python", "-m", "sglang.launch_server"), {"grammar_backend": "none"},
         "its /server_info says grammar_backend = none"),
        (("python", "-m", "sglang.launch_server", "--grammar-backend", "none"), {"grammar_backend": "none"},
         "its command has `--grammar-backend none`"),
        ((), {"grammar_backend": "xgrammar"}, None),
    ],
)
def test_backend_disabled_reads_what_the_service_serves(command: tuple[str, ...],
                                                        server_info: dict[str, Any] | None,
                                                        said: str | None) -> None:
    """`--grammar-backend none` is named from /server_info where SGLang says it, else from the command."""
    service = SimpleNamespace(served=served_config(command, server_info))
    assert backend_disabled(service) == said  # type: ignore[arg-type]


# --- reasoning, then the constrained answer (layers/generation/chat_surface.py) ---------------------------

ANSWER = '{"name": "ab", "age": 3}'


def test_a_reasoned_answer_is_read_from_a_body_and_from_a_stream() -> None:
    body = {"choices": [{"message": {"reasoning_content": "hm", "content": ANSWER}, "finish_reason": "stop"}]}
    whole = reasoned_answer(body)
    assert (whole.reasoning, whole.content, whole.finish_reason) == ("hm", ANSWER, "stop")
    chunks = [{"choices": [{"delta": {"role": "assistant", "content": "", "reasoning_content": None}}]},
              {"choices": [{"delta": {"reasoning_content": "h", "content": None}}]},
              {"choices": [{"delta": {"reasoning_content": "m", "content": None}}]},
              {"choices": [{"delta": {"reasoning_content": None, "content": ANSWER}}]},
              {"choices": [{"delta": {"reasoning_content": None}, "finish_reason": "stop"}]}]  # fmt: skip
    streamed = reasoned_answer(events=chunks, done=False)
    assert (streamed.reasoning, streamed.content, streamed.finish_reason, streamed.done) == ("hm", ANSWER, "stop",
                                                                                             False)


def test_content_in_the_schema_after_free_reasoning_passes() -> None:
    check_reasoned(ReasonedAnswer("not JSON at all {", ANSWER, "stop"), GRAMMARS["response_format"], what="svc",
                   max_tokens=8)  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (ReasonedAnswer(ANSWER, "", "stop"), r"svc: content '' not JSON .*the answer is in reasoning_content "
                                             r"\('\{\"name\".*the grammar held from the first token"),
        (ReasonedAnswer("hm</think>", ANSWER, "stop"), "reasoning_content still holds '</think>'"),
        (ReasonedAnswer("hm", "</think>" + ANSWER, "stop"), "content still holds '</think>'"),
        (ReasonedAnswer("hm", '{"name": 1}', "stop"), "breaks the schema"),
        (ReasonedAnswer("hm", '{"na', "abort"), "finish_reason 'abort' after reasoning 'hm'"),
        (ReasonedAnswer("hm", ANSWER, "stop", done=False), r"the stream stopped without \[DONE\]"),
    ],
)
def test_an_answer_outside_the_schema_or_not_separated_fails(answer: ReasonedAnswer, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_reasoned(answer, GRAMMARS["response_format"], what="svc", max_tokens=8)


def test_a_length_finish_while_reasoning_could_not_be_checked() -> None:
    """Still thinking at max_tokens: no content to judge, so "could not check" (never a pass)."""
    with pytest.raises(pytest.skip.Exception, match=r"could not check: svc: still reasoning when max_tokens=8"):
        check_reasoned(ReasonedAnswer("hmm", "", "length"), GRAMMARS["response_format"], what="svc", max_tokens=8)


def test_content_cut_by_length_with_no_token_count_could_not_be_checked() -> None:
    """Before: content '{' after the reasoning, finish 'length' and no count passed as a prefix (a stream cut
    short reads the same); with the count it is judged."""
    pytest.importorskip("xgrammar")
    with pytest.raises(pytest.skip.Exception, match=r"could not check: svc: finished by length after content"):
        check_reasoned(ReasonedAnswer("hmm", "{", "length"), GRAMMARS["response_format"], what="svc", max_tokens=8)
    check_reasoned(ReasonedAnswer("hmm", "{", "length", tokens=8), GRAMMARS["response_format"], what="svc",
                   max_tokens=8)


# --- forced tool calls, whole and streamed (layers/generation/chat_surface.py) ------------------------------


def chunk(*calls: dict[str, Any], reason: str | None = None, content: str | None = None) -> dict[str, Any]:
    """One SSE chunk as SGLang 0.5.17 streams a tool call (pydantic: every field of the delta)."""
    delta = {"role": None, "content": content, "reasoning_content": None, "tool_calls": list(calls) or None}
    return {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                         "finish_reason": reason}]}


def first(index: int, name: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "index": index, "type": "function", "function": {"name": name, "arguments": ""}}


def more(index: int, fragment: str) -> dict[str, Any]:
    return {"id": None, "index": index, "type": "function", "function": {"name": None, "arguments": fragment}}


ROLE: dict[str, Any] = {"choices": [{"index": 0, "delta": {"reasoning_content": None, "role": "assistant", "content": ""}}]}
FINISH: dict[str, Any] = {"choices": [{"index": 0, "delta": {"reasoning_content": None}, "finish_reason": "tool_calls"}]}


def test_fragments_split_mid_string_are_put_together_per_index() -> None:
    events = [ROLE, chunk(first(0, "get_weather")), chunk(more(0, '{"ci')), chunk(more(0, 'ty": "Pa')),
              chunk(more(0, 'ris\\u00e9"')), chunk(more(0, "}")), FINISH]  # fmt: skip
    answer = streamed_tool_calls(events, done=True)
    assert answer.tool_calls == (ToolCall("get_weather", '{"city": "Paris\\u00e9"}', "call_1", "function", 0),)
    assert (answer.finish_reason, answer.content) == ("tool_calls", "")
    check_tool_calls(answer, None, what="svc")


def test_two_calls_interleaved_by_index_are_two_calls() -> None:
    events = [ROLE, chunk(first(0, "add", "call_a")), chunk(more(0, '{"a": 1, ')),
              chunk(first(1, "get_weather", "call_b")), chunk(more(1, '{"city": "Rome"}')), chunk(more(0, '"b": 2}')),
              FINISH]  # fmt: skip
    answer = streamed_tool_calls(events, done=True)
    assert [(c.id, c.name, c.arguments) for c in answer.tool_calls] == [
        ("call_a", "add", '{"a": 1, "b": 2}'), ("call_b", "get_weather", '{"city": "Rome"}')]
    check_tool_calls(answer, None, what="svc")
    with pytest.raises(AssertionError, match="svc: the call names 'get_weather', not add"):
        check_tool_calls(answer, "add", what="svc")


def test_the_whole_and_the_streamed_answer_are_judged_alike() -> None:
    call = {"id": "call_1", "index": 0, "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    whole = tool_call_answer({"message": {"content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"})
    streamed = streamed_tool_calls([ROLE, chunk(first(0, "add")), chunk(more(0, '{"a": 1}')), FINISH], done=True)
    assert whole.tool_calls == streamed.tool_calls and whole.finish_reason == streamed.finish_reason
    for answer in (whole, streamed):
        with pytest.raises(AssertionError, match=r"the arguments of 'add' '\{\"a\": 1\}' break its parameters' "
                                                 "schema: 'b' is a required property"):
            check_tool_calls(answer, "add", what="svc")


@pytest.mark.parametrize(
    ("events", "done", "message"),
    [
        ([ROLE, chunk(first(0, "add")), chunk(more(0, '{"a": 1, "b": 2}')), FINISH], False,
         r"svc: the stream stopped without \[DONE\] after 1 tool call"),
        ([ROLE, chunk(first(0, "add")), chunk(more(0, '{"a": 1, "b": 2}'))], True,
         "svc: the stream ended without a finish_reason"),
        ([ROLE, chunk(more(0, '{"a": 1, "b": 2}')), FINISH], True,
         "malformed tool-call deltas: the first delta of call 0 carries no id and function.name"),
        ([ROLE, chunk(first(0, "add")), chunk({"id": None, "function": {"arguments": "{}"}}), FINISH], True,
         "a tool-call delta without an integer index"),
        ([ROLE, chunk(first(0, "add")), chunk(first(0, "get_weather")), FINISH], True,
         "call 0 is named 'add', then 'get_weather'"),
        ([ROLE, chunk(content='[{"name": "add"'), {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}],
         True, "expected finish_reason 'tool_calls' with tool calls, got finish_reason 'stop', no tool call at all, "
               "content '\\[\\{\"name\": \"add\"'"),
        ([ROLE, chunk(first(0, "add")), chunk(more(0, '{"a": 1, "b"')),
          {"choices": [{"index": 0, "delta": {}, "finish_reason": "abort"}]}], True, "got finish_reason 'abort'"),
    ],
)
def test_a_broken_or_unfinished_stream_fails(events: list[dict[str, Any]], done: bool, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_tool_calls(streamed_tool_calls(events, done=done), None, what="svc")


def test_a_streamed_call_cut_by_max_tokens_fails_naming_the_call_and_the_limit() -> None:
    events = [ROLE, chunk(first(0, "add")), chunk(more(0, '{"a": 1')),
              {"choices": [{"index": 0, "delta": {"reasoning_content": None}, "finish_reason": "length"}]}]
    with pytest.raises(AssertionError, match=re.escape("svc: the forced call was cut by max_tokens=200 (finish_reason "
                                                       "'length'): add('{\"a\": 1') is not a complete call")):
        check_tool_calls(streamed_tool_calls(events, done=True), None, what="svc")


def test_a_tool_call_delta_counts_as_a_streamed_token() -> None:
    """The client's progress (deadline messages) counts tool-call chunks as tokens too."""
    assert stream_tokens([chunk(more(0, '{"a'))], 3) == 4
    assert stream_tokens([FINISH], 3) == 3


@pytest.mark.parametrize(("text", "problem"), [
    ('{"name": "river(Ti is\ufffd\ufffd", "age": 1}', None),  # 13 characters decoded, 12 as the grammar saw bytes
    ('{"name": "river(Ti is\ufffd\ufffd\ufffd\ufffd", "age": 1}', None),  # one 4-byte character, byte by byte
    ('{"name": "river(Ti isXY", "age": 1}', "breaks the schema"),  # 13 real characters
    ('{"name": "\ufffd\ufffd\ufffd", "age": "1"}', "breaks the schema"),  # collapsing fixes nothing else
    ('{"name": "river(Ti is' + "\ufffd" * 5 + '", "age": 1}', "breaks the schema"),  # 5 bytes: 2 characters
    ('{"name": "river(Ti is' + "\ufffd" * 13 + '", "age": 1}', "breaks the schema"),  # at least 4 characters
    ('{"name": "' + "\ufffd" * 60 + '", "age": 1}', "breaks the schema"),  # at least 15 characters
    ('{"name": "' + "\ufffd" * 48 + '", "age": 1}', None),  # 48 bytes can be 12 characters of 4 bytes
])
def test_a_run_of_replacement_characters_stands_for_the_fewest_characters_its_bytes_can_be(
        text: str, problem: str | None) -> None:
    """A byte-level token ending inside a multi-byte character decodes to one U+FFFD per stray byte (recorded
    from real SGLang 0.5.17): a run of k stands for at least ceil(k/4) characters (4 bytes at most each), never
    for one whatever its length."""
    found = GRAMMARS["json_schema"].problem(text)
    assert found is None if problem is None else found is not None and found.startswith(problem), found
    if problem is None and importlib.util.find_spec("xgrammar"):
        assert GRAMMARS["json_schema"].prefix_problem(text[:-8]) is None


# --- a length finish that max_tokens did not cause, and answers of the wrong shape ---------------------------


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        (Outcome("", "length"), "says finish_reason 'length' with no output at all"),
        (Outcome('{"name": "a', "length", tokens=3), "says finish_reason 'length' after 3 of max_tokens=8"),
    ],
)
def test_a_length_finish_before_max_tokens_fails(outcome: Outcome, message: str) -> None:
    """A length finish is a prefix only when max_tokens cut it: a server saying "length" with no output, or
    fewer tokens by its own count, would otherwise pass every grammar with a warning."""
    with pytest.raises(AssertionError, match=message):
        check_outcome(outcome, GRAMMARS["json_schema"], what="svc", max_tokens=8)
    pytest.importorskip("xgrammar")
    check_outcome(Outcome('{"name": "a', "length", tokens=8), GRAMMARS["json_schema"], what="svc", max_tokens=8)


def test_a_length_finish_before_max_tokens_fails_the_reasoned_answer_and_the_tool_call() -> None:
    with pytest.raises(AssertionError, match="svc: the answer says finish_reason 'length' with no output"):
        check_reasoned(ReasonedAnswer(None, "", "length"), GRAMMARS["response_format"], what="svc", max_tokens=8)
    with pytest.raises(AssertionError, match="after 2 of max_tokens=8 tokens"):
        check_reasoned(reasoned_answer({"choices": [{"message": {"reasoning_content": "hm", "content": ""},
                                                     "finish_reason": "length"}],
                                        "usage": {"completion_tokens": 2}}),
                       GRAMMARS["response_format"], what="svc", max_tokens=8)  # fmt: skip
    empty = tool_call_answer({"message": {"content": None, "tool_calls": None}, "finish_reason": "length"})
    with pytest.raises(AssertionError, match="svc: the answer says finish_reason 'length' with no output"):
        check_tool_calls(empty, None, what="svc")
    rambled = tool_call_answer({"message": {"content": "I think so", "tool_calls": None}, "finish_reason": "length",
                                "usage": {"completion_tokens": 200}})
    with pytest.raises(AssertionError, match="svc: no tool call at all: the output ran to max_tokens=200"):
        check_tool_calls(rambled, None, what="svc")


def test_tool_call_arguments_that_are_not_a_string_fail_in_one_line() -> None:
    """OpenAI's function.arguments is a JSON string; an object there breaks a client's json.loads."""
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    answer = tool_call_answer({"message": {"tool_calls": [call]}, "finish_reason": "tool_calls"})
    with pytest.raises(AssertionError, match="svc: the arguments of 'add' are a JSON object, not a JSON string"):
        check_tool_calls(answer, None, what="svc")


@pytest.mark.parametrize(("change", "said"), [
    ({"id": None}, "the call has id None and type 'function'"),
    ({"id": ""}, "the call has id '' and type 'function'"),
    ({"type": "tool"}, "the call has id 'c' and type 'tool'"),
])
def test_a_call_without_an_id_or_of_another_type_fails(change: dict[str, Any], said: str) -> None:
    """A client answers a call with a tool message naming the call's id: a call without one cannot be answered."""
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    check_tool_calls(tool_call_answer({"message": {"tool_calls": [call]}, "finish_reason": "tool_calls"}), None,
                     what="svc")
    answer = tool_call_answer({"message": {"tool_calls": [{**call, **change}]}, "finish_reason": "tool_calls"})
    with pytest.raises(AssertionError, match=re.escape(f"svc: {said}")):
        check_tool_calls(answer, None, what="svc")


@pytest.mark.parametrize(
    "events",
    [
        [{"choices": [1, {"delta": "x"}, {"delta": None, "finish_reason": "stop"}]}],
        [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": "add"}]}}]}],
    ],
)
def test_chunks_of_the_wrong_shape_are_read_without_a_crash(events: list[dict[str, Any]]) -> None:
    assert streamed_outcome(events, "chat", done=True).content == ""
    assert reasoned_answer(events=events).content == ""
    assert streamed_tool_calls(events, done=True).content == ""


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_a_grammar_is_described_without_cutting_a_word(name: str) -> None:
    """A failure names its grammar in 160 characters at most, cut after a whole token: the json_schema case
    read '… "required": ["name", "age"], "additi' (issue 41: nothing cut mid-word)."""
    shown = GRAMMARS[name].describe()
    value = GRAMMARS[name].value
    whole = value if isinstance(value, str) else json.dumps(value)
    quoted = shown[len(GRAMMARS[name].name) + 1:]
    assert len(quoted) <= 160 + 3
    if len(whole) > 160:
        kept = quoted[1:-2].rstrip("…").rstrip()
        assert whole.startswith(kept) and whole[len(kept)] == " ", shown


def _cut_stream(honours_usage: bool) -> Any:
    """A server that ends a streamed constrained chat after one token ('{') with finish_reason 'length', and
    sends the usage chunk (its true count, 1) where the request asks for it and `honours_usage`."""
    from services.http_doubles import Reply

    def rule(method: str, path: str, body: Any) -> Reply | None:
        if method != "POST" or not isinstance(body, dict) or not body.get("stream"):
            return None
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "{"}, "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length"}]}]
        if honours_usage and (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1,
                                                    "total_tokens": 6}})
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return Reply(200, text.encode(), content_type="text/event-stream")
    return rule


@pytest.mark.parametrize("honours_usage", [True, False], ids=["usage", "no-usage"])
def test_a_stream_cut_short_by_a_length_finish_is_no_prefix(honours_usage: bool) -> None:
    """Before: a streamed chat constrained request sent no stream_options.include_usage, so a stream ended by
    'length' after one valid token ('{', of max_tokens=160) passed as a prefix; now its count says it was not
    max_tokens (fails), and an answer with no count at all is 'could not check', never a pass."""
    from services.http_doubles import FaultProxy

    from pytest_dflash.client.inference import InferenceClient
    from pytest_dflash.layers.generation.structured import GREEDY, send

    pytest.importorskip("xgrammar")
    grammar = GRAMMARS["response_format"]
    with FaultProxy("http://127.0.0.1:9", _cut_stream(honours_usage)) as server, \
            InferenceClient(server.url, model="m") as client:
        answer = send(client, "chat", grammar, GREEDY, stream=True)
    assert answer.finish_reason == "length" and answer.content == "{"
    if honours_usage:
        with pytest.raises(AssertionError, match="says finish_reason 'length' after 1 of max_tokens=160"):
            check_outcome(answer, grammar, what="svc", max_tokens=GREEDY.max_tokens)
    else:
        with pytest.raises(pytest.skip.Exception, match="could not check: svc: finished by length"):
            check_outcome(answer, grammar, what="svc", max_tokens=GREEDY.max_tokens)
