"""The chat surface around the model: forced tool calls and reasoning separation, as SGLang 0.5.17 serves
them.

Tools: ``tool_choice`` ``"required"`` or a named function turns into a JSON-schema constraint (SGLang's
``get_json_schema_constraint``): an array of one or more ``{"name", "parameters"}`` objects whose name is
one of the tools (or the named one) and whose parameters follow that tool's schema. The constrained output
is then parsed into ``message.tool_calls`` (``function.arguments`` a JSON string), ``content`` null,
``finish_reason`` ``"tool_calls"``. So even an untrained model returns a parseable call.
``--tool-call-parser qwen25`` (alias ``qwen``) also parses ``<tool_call>{...}</tool_call>`` blocks out of
free text under ``tool_choice`` ``"auto"``.

Reasoning: a chat request under ``--reasoning-parser`` reasons (SGLang's ``require_reasoning``): always with
``deepseek-r1``, with ``qwen3`` unless ``chat_template_kwargs`` says ``enable_thinking: false``. Its output is
reasoning up to ``</think>`` (the model starts inside it, so no ``</think>`` means all reasoning); a request
that does not reason splits only an output that opens with ``<think>``. With ``separate_reasoning`` (default
true) the reasoning goes to ``message.reasoning_content`` (streamed: ``delta.reasoning_content``), the rest to
``content``; false keeps the text whole. A constrained request that reasons gets its grammar only after
``</think>`` (structured.py: ThinkPhase), so its ``content`` is the grammar's answer.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from pytest_dflash.refserver.model import ByteTokenizer
from pytest_dflash.refserver.structured import InvalidGrammar

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "parse_tool_calls",
    "require_reasoning",
    "split_reasoning",
    "think_end_ids",
    "tool_call_schema",
    "tool_calls_from_constrained",
]

TOOL_CALL_PARSERS = ("qwen25", "qwen")
REASONING_PARSERS = ("deepseek-r1", "qwen3")
THINK_START, THINK_END = "<think>", "</think>"
QWEN_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def tool_call_schema(tools: object, tool_choice: object) -> str | None:
    """The JSON schema SGLang constrains a forced tool call with; None when the call is not forced."""
    if tool_choice in (None, "auto", "none"):
        return None
    if not isinstance(tools, list) or not tools:
        raise InvalidGrammar("Tool choice requires tools to be specified.")
    raw = [t.get("function") for t in tools if isinstance(t, dict)]
    functions: list[dict[str, Any]] = [f for f in raw
                                       if isinstance(f, dict) and isinstance(f.get("name"), str)]
    if len(functions) != len(tools):
        raise InvalidGrammar("Every tool must be {'type': 'function', 'function': {'name': ..., ...}}.")
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [f for f in functions if f["name"] == name]
        if not chosen:
            raise InvalidGrammar(f"Tool '{name}' not found in tools list.")
        functions = chosen
    elif tool_choice != "required":
        raise InvalidGrammar(f"Invalid tool_choice: {tool_choice!r}.")
    items = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [f["name"]]},
                             "parameters": f.get("parameters") or {"type": "object", "properties": {}}},
              "required": ["name", "parameters"]} for f in functions]  # fmt: skip
    array: dict[str, Any] = {"type": "array", "minItems": 1,
                             "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if isinstance(tool_choice, dict):
        array["maxItems"] = 1
    return json.dumps(array)


def _call(index: int, name: str, arguments: object) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "index": index, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}  # fmt: skip


def tool_calls_from_constrained(text: str) -> list[dict[str, Any]] | None:
    """The tool calls of a forced call's output (the JSON array); None when it is not one (cut by length)."""
    try:
        items = json.loads(text, strict=False)
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    return [_call(i, str(item.get("name")), item.get("parameters", {}))
            for i, item in enumerate(items) if isinstance(item, dict)]  # fmt: skip


def parse_tool_calls(text: str, parser: str | None) -> tuple[str, list[dict[str, Any]]]:
    """Free text and the tool calls a parser finds in it (qwen25: <tool_call>{"name", "arguments"}</tool_call>
    blocks)."""
    if parser not in TOOL_CALL_PARSERS:
        return text, []
    calls: list[dict[str, Any]] = []
    for match in QWEN_TOOL_CALL.finditer(text):
        try:
            item = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            calls.append(_call(len(calls), item["name"], item.get("arguments", {})))
    if not calls:
        return text, []
    return QWEN_TOOL_CALL.sub("", text).strip(), calls


def think_end_ids(parser: str | None) -> tuple[int, ...]:
    """The parser's think-end as token ids (SGLang: tokenizer.encode(think_end_token)); () without one."""
    return tuple(ByteTokenizer().encode(THINK_END)) if parser in REASONING_PARSERS else ()


def require_reasoning(parser: str | None, body: dict[str, Any]) -> bool:
    """Whether a chat request reasons (SGLang serving_chat's _get_reasoning_from_request)."""
    if parser not in REASONING_PARSERS:
        return False
    if parser == "qwen3":  # thinks by default; the chat template's enable_thinking turns it off
        kwargs = body.get("chat_template_kwargs")
        return not isinstance(kwargs, dict) or kwargs.get("enable_thinking", True) is not False
    return True


def split_reasoning(text: str, parser: str | None, *, force: bool = False,
                    partial: bool = False) -> tuple[str | None, str]:
    """(reasoning_content, content) of an output under a reasoning parser; (None, text) without one.

    ``force``: the request reasons, so the output starts inside the reasoning (deepseek-r1: always).
    ``partial``: a stream's text so far; what may be the start of ``<think>`` / ``</think>`` is held back.
    """
    if parser not in REASONING_PARSERS:
        return None, text
    body = text
    if body.startswith(THINK_START):
        body = body[len(THINK_START) :]
    elif partial and THINK_START.startswith(body):
        return "", ""  # maybe the start of <think>
    elif parser == "qwen3" and not force:
        return None, text  # qwen3 not asked to reason: only inside an explicit <think>
    if THINK_END not in body:
        if partial:
            for k in range(min(len(THINK_END) - 1, len(body)), 0, -1):
                if body.endswith(THINK_END[:k]):
                    return body[:-k], ""
        return body, ""
    reasoning, _, content = body.partition(THINK_END)
    return reasoning, content.lstrip("\n")
