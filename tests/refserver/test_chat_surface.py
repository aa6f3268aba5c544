"""Forced tool calls and reasoning separation: SGLang's schema of a forced call, the parsers' splits, which
requests reason."""

from __future__ import annotations

import json

import pytest

from pytest_dflash.refserver.chat_surface import (
    parse_tool_calls,
    require_reasoning,
    split_reasoning,
    think_end_ids,
    tool_call_schema,
    tool_calls_from_constrained,
)
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
