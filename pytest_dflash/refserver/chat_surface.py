"""The chat surface around the model: forced tool calls and reasoning separation, as SGLang 0.5.17 serves
them.

Tools: ``tool_choice`` ``"required"`` or a named function turns into a JSON-schema constraint (SGLang's
``get_json_schema_constraint``): an array of one or more ``{"name", "parameters"}`` objects whose name is
one of the tools (or the named one) and whose parameters follow that tool's schema. The constrained output
is then parsed into ``message.tool_calls`` (``function.arguments`` a JSON string), ``content`` null,
``finish_reason`` ``"tool_calls"``. So even an untrained model returns a parseable call.
``--tool-call-parser qwen25`` (alias ``qwen``) also parses ``<tool_call>{...}</tool_call>`` blocks out of
free text under ``tool_choice`` ``"auto"``. As in SGLang 0.5.17, calls are parsed only where the command sets
``--tool-call-parser``: without one, a forced call's array is plain ``content``.

Streamed, a forced call goes through SGLang's ``JsonArrayParser`` (``ToolCallStream``, a
``BaseFormatDetector.parse_streaming_increment`` over ``[``, ``,`` and ``]``): each call's first chunk
carries its ``id``, ``type`` ``"function"``, ``function.name`` and ``arguments`` ``""`` once the name is
complete; later chunks append ``function.arguments`` fragments, each the part of ``json.dumps`` of the
arguments parsed so far that two successive parses agree on, the rest when the call's object is complete;
whatever the last increment left unsent follows at the finish (``_check_for_unstreamed_tool_args``).

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
from dataclasses import dataclass, field
from typing import Any

from pytest_dflash.refserver.model import ByteTokenizer
from pytest_dflash.refserver.structured import InvalidGrammar

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "ToolCallStream",
    "parse_tool_calls",
    "partial_json",
    "require_reasoning",
    "split_reasoning",
    "think_end_ids",
    "tool_call_schema",
    "tool_calls_cut",
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


def tool_calls_cut(text: str) -> list[dict[str, Any]]:
    """The calls SGLang 0.5.17 reports for a forced call cut by max_tokens: each call whose name came, with
    arguments "null" (recorded: shared/data/sglang-0.5.17-h100-2026-12-06/toolcall-answers.txt)."""
    try:
        items, _ = partial_json(text, partial_strings=False)
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    return [_call(i, item["name"], None) for i, item in enumerate(items)
            if isinstance(item, dict) and isinstance(item.get("name"), str)]  # fmt: skip


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


_NUMBER_OR_WORD = re.compile(r"[-+0-9.eE]+|[a-z]+")
_CUT_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*(\\(?:u[0-9a-fA-F]{0,3})?)$")


def _closed(text: str, *, partial_strings: bool) -> str | None:
    """`text`, a JSON value cut anywhere, made whole: an unfinished value string closed (when
    `partial_strings`, else dropped with its key), an unfinished key dropped, a number cut to its last
    digit, a literal's start read as the literal, open arrays and objects closed; None if nothing is left."""
    tokens: list[str] = []
    stack: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c in "{[":
            stack.append(c)
            tokens.append(c)
            i += 1
        elif c in "}]":
            if not stack:
                return None
            stack.pop()
            tokens.append(c)
            i += 1
        elif c in ",:":
            tokens.append(c)
            i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j < n:
                tokens.append(text[i : j + 1])
                i = j + 1
                continue
            value = bool(tokens) and (tokens[-1] == ":" or (stack[-1:] == ["["] and tokens[-1] in "[,"))
            if value and partial_strings:  # a cut escape (a lone backslash, \u12) goes with the cut
                cut = _CUT_ESCAPE.search(text, i)
                tokens.append(text[i : cut.start(1)] + '"' if cut else text[i:] + '"')
            break
        else:
            match = _NUMBER_OR_WORD.match(text, i)
            if match is None:
                return None
            word = match.group()
            if match.end() == n:  # maybe cut: a number up to its last digit, a literal's start as the literal
                word = word.rstrip("-+.eE") if word[0] in "-0123456789" else word
                word = next((w for w in ("true", "false", "null") if w.startswith(word or "?")), word)
                if word not in ("true", "false", "null") and not word[-1:].isdigit():
                    break
            tokens.append(word)
            i = match.end()
    while tokens:  # a dangling comma, key or colon goes
        if tokens[-1] == ",":
            tokens.pop()
        elif tokens[-1] == ":":
            del tokens[-2:]
        elif tokens[-1].startswith('"') and stack[-1:] == ["{"] and len(tokens) > 1 and tokens[-2] in "{,":
            tokens.pop()
        else:
            break
    if not tokens:
        return None
    return "".join(tokens) + "".join("}" if c == "{" else "]" for c in reversed(stack))


def partial_json(text: str, *, partial_strings: bool = True) -> tuple[Any, int]:
    """The value at the start of `text` and where it ends: a whole value (followed by anything) as
    json.raw_decode reads it, else the value of `text` cut short, made whole (SGLang's _partial_json_loads);
    ValueError when there is none."""
    start = len(text) - len(text.lstrip())
    try:
        return json.JSONDecoder(strict=False).raw_decode(text, start)
    except ValueError:
        pass
    closed = _closed(text[start:], partial_strings=partial_strings)
    if closed is None:
        raise ValueError(f"no JSON value in {text[:40]!r}")
    return json.loads(closed, strict=False), len(text)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@dataclass
class ToolCallStream:
    """SGLang 0.5.17's JsonArrayParser on one choice's stream: the text of a forced call's JSON array in, by
    increments; plain text and tool-call deltas out, as ``parse_streaming_increment`` produces them."""

    names: tuple[str, ...]  # the request's tools, by name
    buffer: str = ""
    current: int = -1  # the call being streamed (SGLang's current_tool_id)
    name_sent: bool = False
    streamed: list[str] = field(default_factory=list)  # arguments sent so far, per call
    seen: list[dict[str, Any]] = field(default_factory=list)  # each call as last parsed (prev_tool_call_arr)
    called: bool = False  # a tool-call delta went out (SGLang's has_tool_calls: the finish says "tool_calls")

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """(plain text, tool-call deltas) for the next `text` of the output."""
        plain, calls = self._feed(text)
        self.called = self.called or bool(calls)
        return plain, calls

    def _feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        self.buffer += text
        now = self.buffer
        separated = self.current > 0 and now.startswith(",")
        if not ("[" in now or "{" in now or separated):
            self.buffer = ""
            return now.replace("]", ""), []
        start = 1 if separated else (now.find("[") + 1 if "[" in now else 0)
        if start >= len(now):
            return "", []
        try:
            call, end = partial_json(now[start:], partial_strings=self.name_sent)
        except ValueError:
            return "", []
        if not isinstance(call, dict) or not call:
            return "", []
        if "name" in call and call["name"] not in self.names:  # not a tool: start over
            self.buffer, self.current, self.name_sent = "", -1, False
            if self.streamed:
                self.streamed.pop()
            return "", []
        if "parameters" in call:
            call["arguments"] = call["parameters"]
        complete = _is_json(now[start : start + end])
        if not self.name_sent:
            if call.get("name") not in self.names:
                return "", []
            self.current = max(self.current, 0)
            while len(self.streamed) <= self.current:
                self.streamed.append("")
            self.name_sent = True
            return "", [self._delta(self.current, call["name"], "")]
        arguments = call.get("arguments")
        if arguments is None:
            return "", []
        index = self.current
        dumped = json.dumps(arguments, ensure_ascii=False)
        before = self.seen[index].get("arguments") if index < len(self.seen) else None
        fragment = None
        if complete:
            fragment = dumped[len(self.streamed[index]) :]
            self.buffer = now[start + end :]
        elif before:
            previous = json.dumps(before, ensure_ascii=False)
            if previous != dumped:
                fragment = _common_prefix(previous, dumped)[len(self.streamed[index]) :]
        while len(self.seen) <= index:
            self.seen.append({})
        self.seen[index] = call
        if complete:
            self.name_sent = False
            self.current += 1
        if fragment is None:
            return "", []
        self.streamed[index] += fragment
        return "", [self._delta(index, None, fragment)]

    def unsent(self) -> dict[str, Any] | None:
        """At the finish: the rest of the last call's arguments, when the increments left some unsent."""
        if not self.seen or not self.streamed:
            return None
        index = len(self.seen) - 1
        if index >= len(self.streamed):
            return None
        arguments = self.seen[index].get("arguments", {})
        expected = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        sent = self.streamed[index]
        rest = expected[len(sent) :] if expected.startswith(sent) else ""
        return self._delta(index, None, rest) if rest else None

    @staticmethod
    def _delta(index: int, name: str | None, arguments: str) -> dict[str, Any]:
        return {"id": f"call_{uuid.uuid4().hex[:24]}" if name else None, "index": index, "type": "function",
                "function": {"name": name, "arguments": arguments}}  # fmt: skip


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
