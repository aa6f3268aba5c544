"""One typed answer per generation request (`Answer`), whole or streamed, native (/generate) or OpenAI: the
one reading of an answer's finish and its reason, content, reasoning, tool calls with their arguments, usage,
meta_info, logprobs, an error event sent inside a stream and, for a stream, how it was framed (`Framing`).
Checks judge an `Answer` (the sampler checks its `Generation` view, client/sampling.py), never the raw JSON:
this module is the only one that reads a generation body's or event's keys.

`whole_answer` / `streamed_answer`: choice 0 (the chat surface and constrained requests ask for one);
`whole_answers`: every choice of an OpenAI body, every entry of a /generate batch (n > 1, batched prompts).
Nothing here judges: a field that came in the wrong shape is kept as it came (a tool call's `arguments` that
is an object stays an object) or, for a stream's tool-call deltas that cannot be put together, named in
`problems`; the checks decide what is wrong.

Streamed tool calls come as OpenAI's ``delta.tool_calls`` chunks: a call's first chunk has its ``index``,
``id``, ``type`` and ``function.name``, later ones append ``function.arguments`` fragments (split anywhere, a
string's middle too), calls told apart by ``index``; they are put together per index.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_dflash.client.bodies import json_kind
from pytest_dflash.errors import ApiError

__all__ = ["Answer", "AnswerApi", "Chunk", "Framing", "InStreamError", "Logprob", "ToolCall", "api_of",
           "event_has_text", "event_tokens", "is_error_event", "stream_tokens", "streamed_answer",
           "whole_answer", "whole_answers"]

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
class Logprob:
    """One entry of SGLang's logprob lists: ``[logprob, token_id, token_text|null]``."""

    logprob: float
    token: int
    text: str | None = None


@dataclass(frozen=True)
class Chunk:
    """One OpenAI choice chunk of a stream, as it came: its text (completions) or delta content (chat), its
    finish_reason and its delta's role."""

    index: object
    text: str
    finish_reason: object
    role: object = None


@dataclass(frozen=True)
class Framing:
    """How a stream was framed, for the checks of its shape; the answer's own fields say what it said.

    Native: each event's cumulative ``output_ids`` (None where an event had none), and the last event's text
    and ``meta_info`` finish_reason and completion_tokens as they came. OpenAI: every choice chunk in order
    (any index), the usage chunks (``usage`` and no choices) and whether the last event was one, the last
    one's ``completion_tokens`` as it came."""

    events: int
    output_ids: tuple[tuple[object, ...] | None, ...] = ()
    last_text: str = ""
    last_finish: object = None
    last_tokens: object = None
    chunks: tuple[Chunk, ...] = ()
    usage_chunks: int = 0
    usage_last: bool = False
    usage_tokens: object = None


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
    index: int | None = None  # the OpenAI choice's index
    logprobs: tuple[Logprob, ...] | None = None  # native meta_info output_token_logprobs, where asked
    top_logprobs: tuple[tuple[Logprob, ...], ...] | None = None  # native output_top_logprobs, where asked
    input_ids: tuple[int, ...] | None = None  # the prompt's ids (input_token_logprobs, where all carry one)
    framing: Framing | None = None  # a stream's: how it was framed
    finish_status: int | None = None  # a native abort's status_code (400: SGLang refused the request)

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


def _finish_status(reason: Any) -> int | None:
    """The status_code of a native finish_reason object (an abort's), where it says one."""
    return _int(reason.get("status_code")) if isinstance(reason, dict) else None


def _tool_call(item: Any) -> ToolCall:
    if not isinstance(item, dict):
        return ToolCall(None, None, type=None)
    function = item.get("function")
    function = function if isinstance(function, dict) else {}
    return ToolCall(function.get("name"), function.get("arguments"), item.get("id"),
                    item.get("type", "function"), item.get("index"))


def _entries(raw: Any) -> tuple[Logprob, ...]:
    """SGLang's ``[logprob, token_id, token_text|null]`` entries; an entry of another shape is left out."""
    return tuple(Logprob(float(item[0]), int(item[1]), item[2] if len(item) > 2 and isinstance(item[2], str)
                         else None)
                 for item in raw if isinstance(item, list) and len(item) >= 2
                 and isinstance(item[0], int | float) and _int(item[1]) is not None)


def _input_ids(raw: Any) -> tuple[int, ...] | None:
    """The prompt's token ids of ``input_token_logprobs`` (the first entry's logprob is null); None unless
    every entry carries one."""
    if not isinstance(raw, list) or not raw:
        return None
    ids = [item[1] for item in raw if isinstance(item, list) and len(item) >= 2 and _int(item[1]) is not None]
    return tuple(ids) if len(ids) == len(raw) else None


def _native(item: Any, service: str) -> Answer:
    """One /generate answer; what is wrong with one that is not is quoted as it came."""
    if not isinstance(item, dict):
        raise ApiError(service, "/generate", 200, f"response is {json_kind(item)}, not an object",
                       json.dumps(item)[:300])
    lacking = [key for key in ("text", "meta_info") if key not in item]
    if lacking or not isinstance(item["meta_info"], dict):
        problem = (f"response lacks {' and '.join(lacking)}" if lacking
                   else f"response's meta_info is {json_kind(item['meta_info'])}, not an object")
        raise ApiError(service, "/generate", 200, problem, json.dumps(item)[:300])
    meta = item["meta_info"]
    kind, message, matched = _finish(meta.get("finish_reason"))
    ids, top = item.get("output_ids"), meta.get("output_top_logprobs")
    return Answer("generate", str(item["text"]), kind, message, matched,
                  finish_status=_finish_status(meta.get("finish_reason")),
                  completion_tokens=_int(meta.get("completion_tokens")),
                  prompt_tokens=_int(meta.get("prompt_tokens")), meta_info=meta,
                  output_ids=tuple(ids) if isinstance(ids, list) else None,
                  logprobs=(_entries(meta["output_token_logprobs"] or [])
                            if "output_token_logprobs" in meta else None),
                  top_logprobs=(tuple(_entries(step or []) for step in top) if isinstance(top, list)
                                else None),
                  input_ids=_input_ids(meta.get("input_token_logprobs")))


def _choices(data: Any, service: str, path: str) -> list[dict[str, Any]]:
    """The choices of an OpenAI answer, each an object with its `message` (chat) an object; an answer that has
    none (a 200 that carries an error object, no choices, a list) is an ApiError quoting it."""
    if not isinstance(data, dict):
        raise ApiError(service, path, 200, f"response is {json_kind(data)}, not an object",
                       json.dumps(data)[:300])
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ApiError(service, path, 200, "response has no choices", json.dumps(data)[:300])
    for choice in choices:
        if not isinstance(choice, dict):
            raise ApiError(service, path, 200, f"a choice is {json_kind(choice)}, not an object",
                           json.dumps(data)[:300])
        if path == "/v1/chat/completions" and not isinstance(choice.get("message"), dict):
            raise ApiError(service, path, 200, "response's choice has no message", json.dumps(data)[:300])
    return choices


def _openai(choice: dict[str, Any], usage: dict[str, Any], api: AnswerApi, service: str, data: Any) -> Answer:
    kind, message, _ = _finish(choice.get("finish_reason"))
    common: dict[str, Any] = {"matched_stop": choice.get("matched_stop"), "usage": usage,
                              "completion_tokens": _int(usage.get("completion_tokens")),
                              "prompt_tokens": _int(usage.get("prompt_tokens")),
                              "index": _int(choice.get("index"))}
    if api == "completions":
        return Answer(api, str(choice.get("text") or ""), kind, message, **common)
    chat = choice["message"]
    thought = chat.get("reasoning_content")
    calls = chat.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise ApiError(service, "/v1/chat/completions", 200,
                       f"message.tool_calls is {json_kind(calls)}, not a list", json.dumps(data)[:300])
    return Answer(api, str(chat.get("content") or ""), kind, message,
                  reasoning=None if thought is None else str(thought),
                  tool_calls=tuple(_tool_call(c) for c in calls or ()), **common)


def whole_answers(data: Any, api: AnswerApi, service: str) -> list[Answer]:
    """Every answer of a whole (non-streamed) body: a /generate batch's entries (one object: itself), an
    OpenAI body's choices (usage counts them all together); a body of the wrong shape is an ApiError quoting
    it."""
    if api == "generate":
        return [_native(item, service) for item in (data if isinstance(data, list) and data else [data])]
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    choices = _choices(data, service, path)
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return [_openai(choice, usage, api, service, data) for choice in choices]


def whole_answer(data: Any, api: AnswerApi, service: str) -> Answer:
    """A whole (non-streamed) answer body, choice 0 (a /generate batch: its first entry); one without a choice
    / meta_info is an ApiError quoting it."""
    return whole_answers(data, api, service)[0]


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
        last = events[-1] if events else {}
        final = last["meta_info"] if isinstance(last.get("meta_info"), dict) else {}
        framing = Framing(len(events), tuple(tuple(e["output_ids"]) if isinstance(e.get("output_ids"), list)
                                             else None for e in events),
                          str(last.get("text", "")), final.get("finish_reason"),
                          final.get("completion_tokens"))
        return Answer(api, text, kind, message, matched,
                      finish_status=_finish_status(meta.get("finish_reason")),
                      completion_tokens=_int(meta.get("completion_tokens")),
                      prompt_tokens=_int(meta.get("prompt_tokens")), meta_info=meta,
                      output_ids=tuple(ids) if ids is not None else None, streamed=True, done=done,
                      error=failure, framing=framing)
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
                  streamed=True, done=done, error=failure, problems=tuple(calls.problems),
                  framing=_openai_framing(events))


def _is_usage(event: Mapping[str, Any]) -> bool:
    """A usage chunk: ``usage`` and no choices (stream_options include_usage)."""
    return bool(event.get("usage")) and not event.get("choices")


def _openai_framing(events: Sequence[dict[str, Any]]) -> Framing:
    chunks = []
    for event in events:
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            chunks.append(Chunk(choice.get("index"), str(choice.get("text") or delta.get("content") or ""),
                                choice.get("finish_reason"), delta.get("role")))
    usages = [e["usage"] for e in events if _is_usage(e)]
    tokens = usages[-1].get("completion_tokens") if usages and isinstance(usages[-1], dict) else None
    return Framing(len(events), chunks=tuple(chunks), usage_chunks=len(usages),
                   usage_last=bool(events) and _is_usage(events[-1]), usage_tokens=tokens)


def stream_tokens(events: list[dict[str, Any]], before: int) -> int:
    """Tokens streamed so far: native /generate events carry the cumulative output_ids (or completion_tokens);
    OpenAI chunks carry one delta each (a chunk with text, content or a tool-call delta counts one token, at
    least)."""
    last = events[-1]
    if isinstance(last.get("output_ids"), list):
        return len(last["output_ids"])
    meta = last.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("completion_tokens"), int):
        return int(meta["completion_tokens"])
    usage = last.get("usage")
    if (isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int)
            and not last.get("choices")):
        return max(before, int(usage["completion_tokens"]))
    for choice in last.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("tool_calls"):
            return before + 1
    return before


def event_tokens(event: Mapping[str, Any]) -> int | None:
    """Cumulative tokens after a native event (its output_ids), else None (OpenAI chunks carry text only)."""
    ids = event.get("output_ids")
    return len(ids) if isinstance(ids, list) else None


def event_has_text(event: Mapping[str, Any]) -> bool:
    """An OpenAI chunk whose choice carries text (completions) or delta content (chat)."""
    for choice in event.get("choices") or []:
        if isinstance(choice, dict) and (choice.get("text") or (choice.get("delta") or {}).get("content")):
            return True
    return False


def is_error_event(event: dict[str, Any]) -> bool:
    """An error event (SGLang: ``{"error": {...}}``, no choices, no text), not an answer's chunk."""
    return "error" in event and not event.get("choices") and "text" not in event


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
