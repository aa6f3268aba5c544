"""Forced tool calls and reasoning separation: SGLang's schema of a forced call, the parsers' splits, which
requests reason, and a forced call streamed as delta.tool_calls (SGLang's JsonArrayParser), served for real."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from refserver_helpers import post

from pytest_dflash.refserver.chat_surface import (
    ToolCallStream,
    parse_tool_calls,
    partial_json,
    require_reasoning,
    split_reasoning,
    think_end_ids,
    tool_call_schema,
    tool_calls_from_constrained,
)
from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.refserver.structured import InvalidGrammar

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "sub"}}]


def test_forced_calls_become_an_array_schema() -> None:
    assert tool_call_schema(TOOLS, "auto") is None and tool_call_schema(TOOLS, None) is None
    required = json.loads(tool_call_schema(TOOLS, "required") or "")
    assert required["minItems"] == 1 and len(required["items"]["anyOf"]) == 2
    named = json.loads(tool_call_schema(TOOLS, {"type": "function", "function": {"name": "sub"}}) or "")
    assert named["maxItems"] == 1 and named["items"]["properties"]["name"]["enum"] == ["sub"]


@pytest.mark.parametrize(("tools", "choice", "message"), [
    (None, "required", "Tool choice requires tools"),
    (TOOLS, {"type": "function", "function": {"name": "mul"}}, "Tool 'mul' not found"),
    (TOOLS, "sometimes", "Invalid tool_choice"),
])
def test_bad_tool_choices_are_refused(tools: object, choice: object, message: str) -> None:
    with pytest.raises(InvalidGrammar, match=message):
        tool_call_schema(tools, choice)


def test_constrained_output_and_qwen25_blocks_become_tool_calls() -> None:
    calls = tool_calls_from_constrained('[{"name": "add", "parameters": {"a": 1}}]')
    assert calls is not None and calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert tool_calls_from_constrained('[{"name": "add", "param') is None  # cut by length
    text, found = parse_tool_calls('ok <tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>', "qwen25")
    assert text == "ok" and found[0]["function"]["arguments"] == '{"a": 2}'
    assert parse_tool_calls("<tool_call>{}</tool_call>", None) == ("<tool_call>{}</tool_call>", [])


@pytest.mark.parametrize(("text", "parser", "split"), [
    ("thinking</think>\n\nanswer", "deepseek-r1", ("thinking", "answer")),
    ("<think>thinking</think>answer", "qwen3", ("thinking", "answer")),
    ("still thinking", "deepseek-r1", ("still thinking", "")),
    ("plain answer", "qwen3", (None, "plain answer")),
    ("x</think>y", None, (None, "x</think>y")),
])
def test_reasoning_splits_at_think_end(text: str, parser: str | None, split: tuple[str | None, str]) -> None:
    assert split_reasoning(text, parser) == split


@pytest.mark.parametrize(("text", "parser", "kw", "split"), [
    ("plain answer</think>x", "qwen3", {"force": True}, ("plain answer", "x")),  # qwen3 asked to reason
    ("plain answer</think>x", "qwen3", {}, (None, "plain answer</think>x")),
    ("thinking</thi", "deepseek-r1", {"partial": True}, ("thinking", "")),  # maybe the think-end: held back
    ("<th", "qwen3", {"partial": True}, ("", "")),
    ("thinking</think>\n{", "deepseek-r1", {"partial": True}, ("thinking", "{")),
])
def test_reasoning_splits_forced_and_streamed(text: str, parser: str, kw: dict[str, bool],
                                              split: tuple[str | None, str]) -> None:
    assert split_reasoning(text, parser, **kw) == split


def test_which_requests_reason_and_where_their_thinking_ends() -> None:
    """SGLang's require_reasoning: deepseek-r1 always, qwen3 unless enable_thinking is false."""
    assert require_reasoning("deepseek-r1", {"chat_template_kwargs": {"enable_thinking": False}})
    assert require_reasoning("qwen3", {}) and require_reasoning("qwen3", {"chat_template_kwargs": {}})
    assert not require_reasoning("qwen3", {"chat_template_kwargs": {"enable_thinking": False}})
    assert not require_reasoning(None, {})
    assert think_end_ids("qwen3") == tuple(b"</think>") and think_end_ids(None) == ()


# --- a forced call, streamed ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "strings", "value"), [
    ('{"a": 1', True, {"a": 1}),
    ('{"a": "x\\', True, {"a": "x"}),  # a cut escape goes with the cut
    ('{"a": "x\\u00', True, {"a": "x"}),
    ('{"a": "x\\\\', True, {"a": "x\\"}),  # an escaped backslash stays
    ('{"a": "Par', False, {}),  # no partial strings (SGLang, before a call's name is out)
    ('{"a": tr', True, {"a": True}),  # a literal's start as the literal (partial_json_parser's reading)
    ('{"a": -', True, {}),
    ('{"a": 1.', True, {"a": 1}),
    ('{"a": 1, "b', True, {"a": 1}),
    ('{"a": 1, "b": ', True, {"a": 1}),
    ('{"a": [1, 2', True, {"a": [1, 2]}),
])
def test_partial_json_closes_what_is_cut(text: str, strings: bool, value: object) -> None:
    assert partial_json(text, partial_strings=strings) == (value, len(text))


def test_partial_json_reads_a_whole_value_and_where_it_ends() -> None:
    assert partial_json('{"a": 1}, {"b"') == ({"a": 1}, 8)
    with pytest.raises(ValueError, match="no JSON value"):
        partial_json("   ")


ARRAY = '[{"name":"add","parameters":{"a":12,"b":-3}},{"name":"get_weather","parameters":{"city":"Pa\\"ris"}}]'


def replay(text: str, step: int) -> list[dict[str, Any]]:
    """The tool-call deltas of `text` fed `step` characters at a time, then the finish's remainder."""
    stream = ToolCallStream(("add", "get_weather"))
    deltas: list[dict[str, Any]] = []
    for at in range(0, len(text), step):
        plain, calls = stream.feed(text[at : at + step])
        assert plain == ""
        deltas += calls
    rest = stream.unsent()
    return deltas + ([rest] if rest else [])


@pytest.mark.parametrize("step", [1, 3, 8])
def test_a_streamed_array_becomes_named_calls_then_argument_fragments(step: int) -> None:
    """SGLang's chunks: each call's first names it (id, type, name, arguments ""), the rest append arguments,
    which add up to json.dumps of the call's parameters, as the whole answer's function.arguments."""
    deltas = replay(ARRAY, step)
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        assert delta["type"] == "function" and set(delta) == {"id", "index", "type", "function"}
        if delta["index"] not in calls:
            assert delta["id"].startswith("call_") and delta["function"]["arguments"] == "", delta
            calls[delta["index"]] = {"name": delta["function"]["name"], "arguments": ""}
        else:
            assert delta["id"] is None and delta["function"]["name"] is None, delta
            calls[delta["index"]]["arguments"] += delta["function"]["arguments"]
    assert calls == {0: {"name": "add", "arguments": '{"a": 12, "b": -3}'},
                     1: {"name": "get_weather", "arguments": '{"city": "Pa\\"ris"}'}}
    if step == 1:
        assert len(deltas) > 6  # fragments split the arguments, strings in their middle too


def test_a_call_named_and_completed_in_one_increment_loses_its_arguments() -> None:
    """SGLang 0.5.17's parser handles one step of a call per increment and sends at the finish only the rest
    of arguments it has seen: an increment that completes a call's name and its object names it, nothing
    more (a hazard of multi-token steps under speculative decoding; read from JsonArrayParser)."""
    assert [(d["index"], d["function"]) for d in replay(ARRAY, len(ARRAY))] == [
        (0, {"name": "add", "arguments": ""})]
    stream = ToolCallStream(("add",))
    assert stream.feed('[{"name":"ad')[1] == []
    assert stream.feed('d","parameters":{"a":1,"b":2}}]')[1][0]["function"] == {"name": "add", "arguments": ""}
    assert stream.unsent() is None


def test_the_parser_leaves_text_before_the_array_and_forgets_an_unknown_tool() -> None:
    stream = ToolCallStream(("add",))
    assert stream.feed("ok ") == ("ok ", [])
    assert stream.feed('[{"name":"mul"') == ("", []) and stream.buffer == "" and not stream.called


SERVED_TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def tool_server() -> Iterator[RefServerProcess]:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8",
                          "--tool-call-parser", "qwen25", "--constrained-json-disable-any-whitespace") as server:
        yield server


def sse(server: RefServerProcess, body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=60) as response:  # fmt: skip
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [json.loads(line[6:]) for line in lines if line != "data: [DONE]"], lines[-1] == "data: [DONE]"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_forced_call_streams_as_tool_call_deltas(tool_server: RefServerProcess, choice: object) -> None:
    """The same greedy call, whole and streamed: the deltas add up to the whole answer's call; the finish
    chunk says "tool_calls"; then [DONE]."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "temperature": 0,
            "tools": SERVED_TOOLS, "tool_choice": choice}  # fmt: skip
    whole = post(tool_server, "/v1/chat/completions", body).json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["matched_stop"] is None
    events, done = sse(tool_server, body)
    assert done
    deltas = [c["delta"] for e in events for c in e["choices"]]
    assert deltas[0] == {"reasoning_content": None, "role": "assistant", "content": ""}
    calls = [d for d in deltas if d.get("tool_calls")]
    assert calls and all(d == {"role": None, "content": None, "reasoning_content": None,
                               "tool_calls": d["tool_calls"]} for d in calls)  # fmt: skip
    first, *rest = [d["tool_calls"][0] for d in calls]
    expected = whole["message"]["tool_calls"][0]
    assert (first["index"], first["type"], first["function"]) == (0, "function",
                                                                  {"name": expected["function"]["name"], "arguments": ""})
    assert first["id"].startswith("call_") and first["id"] != expected["id"]
    assert "".join(r["function"]["arguments"] for r in rest) == expected["function"]["arguments"]
    assert len(rest) > 1 and all(r["id"] is None and r["function"]["name"] is None for r in rest)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])


def test_without_a_tool_call_parser_a_forced_call_is_content() -> None:
    """SGLang 0.5.17 parses calls only under --tool-call-parser: the array is the content, whole and streamed."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "temperature": 0,
            "tools": SERVED_TOOLS, "tool_choice": "required"}  # fmt: skip
    with RefServerProcess("--constrained-json-disable-any-whitespace") as server:
        whole = post(server, "/v1/chat/completions", body).json()["choices"][0]
        events, done = sse(server, body)
    assert whole["finish_reason"] == "stop" and whole["message"]["tool_calls"] is None
    assert json.loads(whole["message"]["content"])[0]["name"] in ("add", "get_weather")
    streamed = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert done and streamed == whole["message"]["content"]
    assert not any(c["delta"].get("tool_calls") for e in events for c in e["choices"])
