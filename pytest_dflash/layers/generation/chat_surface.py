"""The chat surface: forced tool calls where the service serves a --tool-call-parser, reasoning separation
where it serves a --reasoning-parser.

SGLang constrains ``tool_choice`` ``"required"`` and a named function with a JSON schema of the call, so
even an untrained model must return a parseable call: ``finish_reason`` ``"tool_calls"``,
``message.tool_calls`` naming a given tool (the named one), ``function.arguments`` a JSON string valid under
the tool's ``parameters``. Streamed, the calls come as OpenAI's ``delta.tool_calls`` chunks: each call's first
chunk has its ``index``, ``id``, ``type`` ``"function"`` and ``function.name``, later ones append
``function.arguments`` fragments (split anywhere, a string's middle too), calls told apart by ``index``; the
fragments are put together per index and the calls judged as a whole answer's, after a ``finish_reason`` and
``data: [DONE]``. A reasoning parser splits the output into ``reasoning_content`` and ``content``;
asked again with ``separate_reasoning: false`` the same greedy output comes back whole, so nothing may be
lost or duplicated by the split and ``</think>`` belongs to neither part. Each check applies only where the
service serves the parser: /server_info's ``tool_call_parser`` / ``reasoning_parser`` (an attached server
needs no command), else its command's (``ServiceHandle.served``, services/served.py); "does not apply"
otherwise.

Reasoning, then a constrained answer: under a reasoning parser SGLang applies a chat's grammar only after the
reasoning ends (its ReasonerGrammarBackend waits for the think-end token), so ``response_format`` holds for
``content`` alone: ``reasoning_content`` is free text, ``content`` must validate against the schema, streamed
and not. An answer that lands in ``reasoning_content`` (the grammar applied from the first token, so the model
never closed its thinking) or a ``</think>`` left in either part fails, naming the grammar.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import jsonschema  # type: ignore[import-untyped]

from pytest_dflash.client.bodies import answer_json, chat_choice, error_message, json_kind
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.documents import loads_json
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.generation.requests import messages
from pytest_dflash.layers.generation.shapes import fail
from pytest_dflash.layers.generation.structured import (
    GRAMMARS,
    NO_BACKEND_FLAG,
    NOT_SERVED,
    SEED_002,
    Grammar,
    GrammarWarning,
    backend_disabled,
    completion_tokens,
    constrained_body,
    length_problem,
)
from pytest_dflash.run.skips import could_not_check, not_applicable, sglang_expected

if TYPE_CHECKING:
    from pytest_dflash.run.state import ServiceHandle

__all__ = [
    "TOOLS",
    "TOOL_CHOICES",
    "ReasonedAnswer",
    "ToolCallAnswer",
    "check_reasoned",
    "check_tool_calls",
    "forced_tool_call",
    "reasoned_answer",
    "reasoning_separated",
    "reasoning_structured",
    "streamed_tool_calls",
    "tool_call_answer",
]

ToolChoice = Literal["required", "named"]
TOOL_CHOICES: tuple[ToolChoice, ...] = ("required", "named")
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
]  # fmt: skip
TOOL_MAX_TOKENS = 200
THINK_END = "</think>"
# room for a reasoning model's thinking before the answer; a length finish is reported, not judged
REASONED = Sampling(max_tokens=400, temperature=0.0)


CHAT_PATH = "/v1/chat/completions"


def _chat_body(service: ServiceHandle, body: dict[str, Any]) -> dict[str, Any]:
    return {"model": service.client.model(), "messages": messages("What should I do?"), "temperature": 0,
            **body}


def _refused(service: ServiceHandle, text: str) -> None:
    """Fail naming the flag and seed 002 where the refusal says the server runs without a grammar backend."""
    __tracebackhide__ = True
    if "grammar-backend none" in text:
        fail(f"{service.name}: a forced tool call is refused as the server runs `{NO_BACKEND_FLAG}`: "
             f"{text[:300]}; {SEED_002}")


def _chat(service: ServiceHandle, body: dict[str, Any]) -> dict[str, Any]:
    """Choice 0 of a chat answer, with the answer's usage; no choice is an ApiError (bodies.chat_choice)."""
    client = service.client
    response = client.request("POST", CHAT_PATH, json_body=_chat_body(service, body))
    if response.status_code >= 400:
        _refused(service, response.text)
        raise ApiError(client.service, CHAT_PATH, response.status_code, "chat refused", response.text[:300])
    data = answer_json(response, client.service, CHAT_PATH)
    return {**chat_choice(data, client.service, CHAT_PATH), "usage": data.get("usage")}


@dataclass(frozen=True)
class ToolCallAnswer:
    """A forced call's answer: its calls (as ``message.tool_calls``), finish reason and content, whether a
    stream ended with [DONE], and what was wrong with a stream's deltas."""

    calls: list[dict[str, Any]]
    finish_reason: str | None
    content: str
    done: bool = True
    problems: tuple[str, ...] = ()
    tokens: int | None = None  # the completion tokens the answer counts, where it says


def tool_call_answer(choice: dict[str, Any]) -> ToolCallAnswer:
    """The answer of a chat response's choice (with the response's usage, as _chat returns it)."""
    message = choice.get("message") or {}
    calls = message.get("tool_calls")
    return ToolCallAnswer(calls if isinstance(calls, list) else [], choice.get("finish_reason"),
                          str(message.get("content") or ""), tokens=completion_tokens(choice.get("usage")))


def streamed_tool_calls(events: Sequence[dict[str, Any]], *, done: bool) -> ToolCallAnswer:
    """The answer of a stream's chunks (choice 0): the ``delta.tool_calls`` put together per ``index`` (the
    first chunk of a call names it, the rest append ``function.arguments``), content and finish reason."""
    calls: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    content, reason = "", None
    for event in events:
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            content += str(delta.get("content") or "")
            reason = choice.get("finish_reason") or reason
            for item in delta.get("tool_calls") or []:
                index = item.get("index") if isinstance(item, dict) else None
                if not isinstance(index, int) or isinstance(index, bool):
                    problems.append(f"a tool-call delta without an integer index: {item!r}")
                    continue
                function = item.get("function")
                function = function if isinstance(function, dict) else {}
                name, fragment = function.get("name"), function.get("arguments")
                call = calls.get(index)
                if call is None:
                    if not name or not item.get("id"):
                        problems.append(f"the first delta of call {index} carries no id and function.name: "
                                        f"{item!r}")
                    call = calls[index] = {"id": item.get("id"), "index": index, "type": item.get("type"),
                                           "function": {"name": name, "arguments": ""}}  # fmt: skip
                elif name and name != call["function"]["name"]:
                    problems.append(f"call {index} is named {call['function']['name']!r}, then {name!r}")
                if fragment is not None and not isinstance(fragment, str):
                    problems.append(f"call {index}: function.arguments fragment {fragment!r} is not a string")
                elif fragment:
                    call["function"]["arguments"] += fragment
    return ToolCallAnswer([calls[i] for i in sorted(calls)], reason, content, done, tuple(problems))


def check_tool_calls(answer: ToolCallAnswer, wanted: str | None, *, what: str,
                     max_tokens: int = TOOL_MAX_TOKENS) -> None:
    """Forced calls of the given tools (`wanted`, where named), arguments valid under their parameters, finish
    reason "tool_calls"; a length finish is reported, not judged."""
    __tracebackhide__ = True
    if not answer.done:
        fail(f"{what}: the stream stopped without [DONE] after {len(answer.calls)} tool call(s) "
             f"{answer.calls!r:.200}")
    if answer.finish_reason is None:
        fail(f"{what}: the stream ended without a finish_reason (tool calls {answer.calls!r:.200}, content "
             f"{answer.content[:120]!r})")
    if answer.problems:
        fail(f"{what}: malformed tool-call deltas: {'; '.join(answer.problems)[:600]}")
    if answer.finish_reason == "length":
        said = answer.content + "".join(str((c.get("function") or {}).get("arguments") or "")
                                        for c in answer.calls if isinstance(c, dict))
        if lie := length_problem(said, answer.tokens, max_tokens):
            fail(f"{what}: the answer {lie}: a length finish is only a prefix when max_tokens cut it")
        warnings.warn(GrammarWarning(f"{what}: finished by length before the call was complete"),
                      stacklevel=2)
        return
    if answer.finish_reason != "tool_calls" or not answer.calls:
        fail(f"{what}: expected finish_reason 'tool_calls' with tool calls, got finish_reason "
             f"{answer.finish_reason!r}, tool_calls {answer.calls or None!r}, content "
             f"{answer.content[:200]!r}")
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in answer.calls:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if name not in parameters or (wanted and name != wanted):
            fail(f"{what}: the call names {name!r}, not {wanted or ' or '.join(parameters)}: {call!r}")
        assert isinstance(function, dict) and isinstance(call, dict)
        call_id, kind = call.get("id"), call.get("type", "function")
        if not isinstance(call_id, str) or not call_id or kind != "function":
            fail(f"{what}: the call has id {call_id!r} and type {kind!r}: a client answers a "
                 f"call with a tool message naming its id, and OpenAI's calls are of type 'function': "
                 f"{call!r:.300}")
        if not isinstance(function.get("arguments"), str):
            fail(f"{what}: the arguments of {name!r} are {json_kind(function.get('arguments'))}, not a JSON "
                 f"string (OpenAI's function.arguments; a client's json.loads breaks on it): {call!r:.300}")
        try:
            arguments = loads_json(function["arguments"], strict=False)
            jsonschema.validate(arguments, parameters[name])
        except (ValueError, jsonschema.ValidationError) as exc:
            fail(f"{what}: the arguments of {name!r} {function.get('arguments')!r} break its parameters' "
                 f"schema: {getattr(exc, 'message', exc)}")


def parser_named(service: ServiceHandle, flag: str, *, constrained: bool) -> str:
    """The parser the service serves for `flag` (`ServiceHandle.served`: /server_info's, else its command's);
    "does not apply" without one, "could not check" where SGLang's /server_info should say it and did not,
    and, for a check that constrains its answer, "does not apply" without structured output by the profile."""
    __tracebackhide__ = True
    config = service.served
    served = config.tool_call_parser if flag == "--tool-call-parser" else config.reasoning_parser
    if not served.known and (expected := sglang_expected(service)):
        could_not_check(f"{service.label}: whether it serves a {flag} is unknown: its command sets none and "
                        f"{expected}")
    if contradiction := served.contradiction():
        could_not_check(f"{service.label}: {contradiction} (test_serves_the_commands_configuration fails "
                        "on it)")
    if served.value is None:
        said = "/server_info says none" if served.known else "it serves no /server_info"
        not_applicable(f"the service serves no {flag} (its command sets none; {said})")
    if constrained and not service.spec.structured_output:
        not_applicable(NOT_SERVED)
    return str(served.value)


def forced_tool_call(service: ServiceHandle, choice: ToolChoice, *, streamed: bool = False) -> None:
    """tool_choice "required" or a named function, whole or streamed: a parseable call of a given tool, valid
    arguments."""
    __tracebackhide__ = True
    parser = parser_named(service, "--tool-call-parser", constrained=True)
    if backend_disabled(service.spec):
        fail(f"{service.name}: its command has `{NO_BACKEND_FLAG}`: tool_choice {choice!r} cannot be "
             f"forced; {SEED_002}")
    wanted = "add" if choice == "named" else None
    tool_choice: object = {"type": "function", "function": {"name": wanted}} if wanted else "required"
    body = {"tools": TOOLS, "tool_choice": tool_choice, "max_tokens": TOOL_MAX_TOKENS}
    what = (f"{service.name}: tool_choice {json.dumps(tool_choice)} (--tool-call-parser {parser})"
            f"{' streamed' if streamed else ''}")
    if not streamed:
        check_tool_calls(tool_call_answer(_chat(service, body)), wanted, what=what)
        return
    try:
        stream = service.client.stream(CHAT_PATH, _chat_body(service, {**body, "stream": True}))
    except ApiError as exc:
        _refused(service, str(exc))
        fail(f"{what}: failed (refused, or the stream broke off): {exc}")
    check_tool_calls(streamed_tool_calls(stream.events, done=stream.done), wanted, what=what)


def reasoning_separated(service: ServiceHandle) -> None:
    """reasoning_content + content are the whole output, split at </think>; the split loses nothing."""
    __tracebackhide__ = True
    parser = parser_named(service, "--reasoning-parser", constrained=False)
    body = {"max_tokens": 48, "ignore_eos": True}
    split = (_chat(service, {**body, "separate_reasoning": True}).get("message") or {})
    unsplit = _chat(service, {**body, "separate_reasoning": False}).get("message") or {}
    whole = str(unsplit.get("content") or "")
    if not whole:  # 48 tokens with ignore_eos: an empty output is no output, and would split into nothing
        fail(f"{service.name} (--reasoning-parser {parser}): asked for 48 tokens with ignore_eos and "
             f"separate_reasoning false, the answer has no content: {unsplit!r:.300}")
    reasoning, content = split.get("reasoning_content"), str(split.get("content") or "")
    what = f"{service.name} (--reasoning-parser {parser})"
    if split.get("reasoning_content") is None and THINK_END in whole:
        fail(f"{what}: the output has {THINK_END!r} but no reasoning_content came back: {whole[:200]!r}")
    for part, text in (("reasoning_content", reasoning or ""), ("content", content)):
        if THINK_END in text:
            fail(f"{what}: {part} still holds {THINK_END!r}: {text[:200]!r}")
    rebuilt = whole.removeprefix("<think>")
    before, _, after = rebuilt.partition(THINK_END)
    expected = (before, after.lstrip("\n")) if reasoning is not None else (None, whole)
    if (reasoning, content) != expected and (reasoning or "", content) != (rebuilt, ""):
        fail(f"{what}: reasoning_content {str(reasoning)[:120]!r} and content {content[:120]!r} are not the "
             f"whole output {whole[:200]!r} split at {THINK_END!r}")


@dataclass(frozen=True)
class ReasonedAnswer:
    """A chat answer under a reasoning parser: its two parts, the finish reason, whether a stream ended."""

    reasoning: str | None
    content: str
    finish_reason: str | None
    done: bool = True  # a stream ended with [DONE]
    tokens: int | None = None  # the completion tokens the answer counts, where it says


def reasoned_answer(data: dict[str, Any] | None = None, events: Sequence[dict[str, Any]] = (), *,
                    done: bool = True) -> ReasonedAnswer:
    """The answer of a chat response body, or of a stream's chunks (reasoning and content deltas added up)."""
    if data is not None:
        choice = (data.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        thought = message.get("reasoning_content")
        thought = None if thought is None else str(thought)
        return ReasonedAnswer(thought, str(message.get("content") or ""), choice.get("finish_reason"),
                              tokens=completion_tokens(data.get("usage")))
    parts: dict[str, str | None] = {"reasoning_content": None, "content": ""}
    reason, tokens = None, None
    for event in events:
        tokens = completion_tokens(event.get("usage")) or tokens
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            for part in parts:
                if delta.get(part):
                    parts[part] = (parts[part] or "") + str(delta[part])
            reason = choice.get("finish_reason") or reason
    return ReasonedAnswer(parts["reasoning_content"], parts["content"] or "", reason, done, tokens)


def check_reasoned(answer: ReasonedAnswer, grammar: Grammar, *, what: str, max_tokens: int) -> None:
    """The reasoning separated from the answer, the answer complete and in the grammar's language."""
    __tracebackhide__ = True
    reasoning = answer.reasoning or ""
    if not answer.done:
        fail(f"{what}: the stream stopped without [DONE] after content {answer.content[-80:]!r}")
    if answer.finish_reason == "length":
        if lie := length_problem(reasoning + answer.content, answer.tokens, max_tokens):
            fail(f"{what}: the answer {lie}: a length finish is only a prefix when max_tokens cut it")
        where = "the answer" if answer.content else "the reasoning (no answer yet)"
        warnings.warn(GrammarWarning(f"{what}: finished by length in {where} after max_tokens={max_tokens}: "
                                     f"not checked as complete: {answer.content[:80]!r}"), stacklevel=2)
        return
    if answer.finish_reason != "stop":
        fail(f"{what}: finish_reason {answer.finish_reason!r} after reasoning {reasoning[-80:]!r} and "
             f"content {answer.content[:120]!r}: a constrained answer must end by its grammar (stop) or by "
             "length")
    for part, text in (("reasoning_content", reasoning), ("content", answer.content)):
        if THINK_END in text:
            fail(f"{what}: {part} still holds {THINK_END!r}, the reasoning is not separated: {text[:200]!r}")
    problem = grammar.problem(answer.content)
    if problem is None:
        return
    landed = ""
    if reasoning and grammar.problem(reasoning.strip()) is None:
        landed = (f"; the answer is in reasoning_content ({reasoning[:120]!r}): the grammar held from the "
                  f"first token instead of after {THINK_END!r}, so the thinking never ended")
    fail(f"{what}: content {answer.content[:200]!r} {problem}{landed}")


def reasoning_structured(service: ServiceHandle, *, streamed: bool) -> None:
    """response_format json_schema under --reasoning-parser: reasoning_content free, content in the schema."""
    __tracebackhide__ = True
    parser = parser_named(service, "--reasoning-parser", constrained=True)
    grammar = GRAMMARS["response_format"]
    what = (f"{service.name}: {grammar.describe()} after reasoning (--reasoning-parser {parser})"
            f"{' streamed' if streamed else ''}")
    if backend_disabled(service.spec):
        fail(f"{what}: its command has `{NO_BACKEND_FLAG}`: the answer cannot be constrained; {SEED_002}")
    client = service.client
    path, body = constrained_body(client, "chat", grammar, REASONED, stream=streamed)
    try:
        if streamed:
            stream = client.stream(path, body)
            answer = reasoned_answer(events=stream.events, done=stream.done)
        else:
            response = client.request("POST", path, json_body=body)
            if response.status_code >= 400:
                raise ApiError(client.service, path, response.status_code, error_message(response),
                               response.text[:500])
            data = answer_json(response, client.service, path)
            chat_choice(data, client.service, path)  # an answer without a choice is no answer
            answer = reasoned_answer(data)
    except ApiError as exc:
        fail(f"{what}: failed (refused, or the stream broke off): {exc}")
    check_reasoned(answer, grammar, what=what, max_tokens=REASONED.max_tokens)
