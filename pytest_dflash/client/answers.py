"""One typed answer per generation request (`Answer`), whole or streamed, native (/generate) or OpenAI: the
one reading of an answer's finish and its reason, content, reasoning, tool calls with their arguments, usage,
meta_info and an error event sent inside a stream. Checks judge an `Answer`, never the raw JSON.

Choice 0 only (the chat surface and constrained requests ask for one). Nothing here judges: a field that came
in the wrong shape is kept as it came (a tool call's `arguments` that is an object stays an object) or, for a
stream's tool-call deltas that cannot be put together, named in `problems`; the checks decide what is wrong.

Streamed tool calls come as OpenAI's ``delta.tool_calls`` chunks: a call's first chunk has its ``index``,
``id``, ``type`` and ``function.name``, later ones append ``function.arguments`` fragments (split anywhere, a
string's middle too), calls told apart by ``index``; they are put together per index.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_dflash.client.bodies import chat_choice, json_kind, native_answer
from pytest_dflash.errors import ApiError

__all__ = ["Answer", "AnswerApi", "InStreamError", "ToolCall", "api_of", "streamed_answer", "whole_answer"]

AnswerApi = Literal["generate", "completions", "chat"]
_APIS: dict[str, AnswerApi] = {"/generate": "generate", "/v1/completions": "completions",
                               "/v1/chat/completions": "chat"}


def api_of(path: str) -> AnswerApi:
    """The dialect of a generation path; ValueError for any other path."""
    try:
        return _APIS[path]
    except KeyError:
        raise ValueError(f"{path!r} is not a generation path ({', '.join(_APIS)})") from None


@dataclass(frozen=True)
class ToolCall:
    """One call as the answer gave it (OpenAI's ``message.tool_calls`` item); values kept as they came."""

    name: object
    arguments: object  # OpenAI: a JSON string; kept whatever it was
    id: object = None
    type: object = "function"
    index: object = None

    def describe(self) -> str:
        return f"{self.name}({self.arguments!r:.200})"


@dataclass(frozen=True)
class InStreamError:
    """An error event inside an HTTP 200 stream (SGLang serving_chat: ``data: {"error": {..., "code": 400}}``
    then [DONE], for a request the scheduler refused after the stream began)."""

    message: str
    code: int | None
    type: str | None = None


@dataclass(frozen=True)
class Answer:
    """Choice 0 of one generation answer, normalised across dialects and across whole / streamed."""

    api: AnswerApi
    content: str  # chat: message.content (after the reasoning); completions / native: the text
    finish_reason: str | None  # native finish_reason.type, OpenAI finish_reason
    finish_message: str | None = None  # an abort's message, where the server gave one
    matched_stop: object = None
    reasoning: str | None = None  # chat: reasoning_content (None: the field was absent or null throughout)
    tool_calls: tuple[ToolCall, ...] = ()
    completion_tokens: int | None = None  # the answer's own count (usage or meta_info), where it says
    prompt_tokens: int | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    meta_info: Mapping[str, Any] = field(default_factory=dict)
    output_ids: tuple[int, ...] | None = None
    streamed: bool = False
    done: bool = True  # a stream ended with [DONE] (a whole answer: True)
    error: InStreamError | None = None
    problems: tuple[str, ...] = ()  # stream deltas that could not be put together

    @property
    def output(self) -> str:
        """Everything the sampler produced, reasoning first: what a sampling check compares."""
        return (self.reasoning or "") + self.content


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finish(reason: Any) -> tuple[str | None, str | None, object]:
    """(type, message, matched) of a native finish_reason object or an OpenAI finish_reason string."""
    if isinstance(reason, dict):
        message = reason.get("message")
        return (str(reason["type"]) if reason.get("type") is not None else None,
                str(message) if message is not None else None, reason.get("matched"))
    return (str(reason) if reason is not None else None), None, None


def _tool_call(item: Any) -> ToolCall:
    if not isinstance(item, dict):
        return ToolCall(None, None, type=None)
    function = item.get("function")
    function = function if isinstance(function, dict) else {}
    return ToolCall(function.get("name"), function.get("arguments"), item.get("id"),
                    item.get("type", "function"), item.get("index"))


def whole_answer(data: Any, api: AnswerApi, service: str) -> Answer:
    """A whole (non-streamed) answer body; one without a choice / meta_info is an ApiError quoting it."""
    if api == "generate":
        body = native_answer(data, service)
        meta = body["meta_info"]
        kind, message, matched = _finish(meta.get("finish_reason"))
        ids = body.get("output_ids")
        return Answer(api, str(body.get("text", "")), kind, message, matched,
                      completion_tokens=_int(meta.get("completion_tokens")),
                      prompt_tokens=_int(meta.get("prompt_tokens")), meta_info=meta,
                      output_ids=tuple(ids) if isinstance(ids, list) else None)
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    choice = chat_choice(data, service, path)
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    kind, message, _ = _finish(choice.get("finish_reason"))
    common: dict[str, Any] = {"matched_stop": choice.get("matched_stop"), "usage": usage,
                              "completion_tokens": _int(usage.get("completion_tokens")),
                              "prompt_tokens": _int(usage.get("prompt_tokens"))}
    if api == "completions":
        return Answer(api, str(choice.get("text") or ""), kind, message, **common)
    chat = choice["message"]
    thought = chat.get("reasoning_content")
    calls = chat.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise ApiError(service, path, 200, f"message.tool_calls is {json_kind(calls)}, not a list",
                       json.dumps(data)[:300])
    return Answer(api, str(chat.get("content") or ""), kind, message,
                  reasoning=None if thought is None else str(thought),
                  tool_calls=tuple(_tool_call(c) for c in calls or ()), **common)


@dataclass
class _Calls:
    """Streamed tool-call deltas put together per index."""

    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add(self, item: Any) -> None:
        index = item.get("index") if isinstance(item, dict) else None
        if not isinstance(index, int) or isinstance(index, bool):
            self.problems.append(f"a tool-call delta without an integer index: {item!r:.200}")
            return
        function = item.get("function")
        function = function if isinstance(function, dict) else {}
        name, fragment = function.get("name"), function.get("arguments")
        call = self.calls.get(index)
        if call is None:
            if not name or not item.get("id"):
                self.problems.append(f"the first delta of call {index} carries no id and function.name: "
                                     f"{item!r:.200}")
            call = self.calls[index] = {"id": item.get("id"), "index": index, "type": item.get("type"),
                                        "name": name, "arguments": ""}  # fmt: skip
        elif name and name != call["name"]:
            self.problems.append(f"call {index} is named {call['name']!r}, then {name!r}")
        if fragment is not None and not isinstance(fragment, str):
            self.problems.append(f"call {index}: function.arguments fragment {fragment!r:.100} is not a "
                                 "string")
        elif fragment:
            call["arguments"] += fragment

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c["name"], c["arguments"], c["id"], c["type"], c["index"])
                     for _, c in sorted(self.calls.items()))


def streamed_answer(events: Sequence[dict[str, Any]], api: AnswerApi, *, done: bool,
                    error: Mapping[str, Any] | None = None) -> Answer:
    """The answer of a stream's events: native events carry the cumulative text and meta_info; OpenAI chunks
    carry deltas (content, reasoning_content, tool calls), choice 0's added up; `error`: the stream's error
    event (its ``error`` object), if one came."""
    failure = _in_stream_error(error)
    if api == "generate":
        text, ids = "", None
        meta: dict[str, Any] = {}
        for event in events:
            text = str(event.get("text", text))
            meta = event["meta_info"] if isinstance(event.get("meta_info"), dict) else meta
            ids = event["output_ids"] if isinstance(event.get("output_ids"), list) else ids
        kind, message, matched = _finish(meta.get("finish_reason"))
        return Answer(api, text, kind, message, matched,
                      completion_tokens=_int(meta.get("completion_tokens")),
                      prompt_tokens=_int(meta.get("prompt_tokens")), meta_info=meta,
                      output_ids=tuple(ids) if ids is not None else None, streamed=True, done=done,
                      error=failure)
    content, thought, reason, matched = "", None, None, None
    usage: dict[str, Any] = {}
    calls = _Calls()
    for event in events:
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if api == "completions":
                content += str(choice.get("text") or "")
            else:
                delta = choice.get("delta")
                delta = delta if isinstance(delta, dict) else {}
                content += str(delta.get("content") or "")
                if delta.get("reasoning_content"):
                    thought = (thought or "") + str(delta["reasoning_content"])
                for item in delta.get("tool_calls") or []:
                    calls.add(item)
            if choice.get("finish_reason"):
                reason, matched = str(choice["finish_reason"]), choice.get("matched_stop")
    return Answer(api, content, reason, None, matched, thought, calls.tool_calls(),
                  _int(usage.get("completion_tokens")), _int(usage.get("prompt_tokens")), usage,
                  streamed=True, done=done, error=failure, problems=tuple(calls.problems))


def _in_stream_error(error: Mapping[str, Any] | None) -> InStreamError | None:
    if error is None:
        return None
    inner = error.get("error")
    inner = inner if isinstance(inner, dict) else {"message": inner}
    code = inner.get("code")
    code = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
    kind = inner.get("type")
    return InStreamError(str(inner.get("message") or json.dumps(error)[:300]), code,
                         str(kind) if kind is not None else None)
