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
from typing import TYPE_CHECKING, Any, Literal

import jsonschema  # type: ignore[import-untyped]

from pytest_dflash.client.answers import Answer
from pytest_dflash.client.bodies import json_kind
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
    backend_disabled,
    constrained_body,
    length_problem,
    prefix_or_unchecked,
    room_to_think,
    still_reasoning,
)
from pytest_dflash.run.skips import could_not_check, not_applicable, sglang_expected

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

__all__ = [
    "TOOLS",
    "TOOL_CHOICES",
    "check_reasoned",
    "check_tool_calls",
    "forced_tool_call",
    "reasoning_separated",
    "reasoning_structured",
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
# A forced call is sent greedy and sampled: a server that forces calls only for greedy requests fails.
TOOL_SAMPLINGS: dict[str, Sampling] = {"greedy": Sampling(max_tokens=TOOL_MAX_TOKENS, temperature=0.0),
                                       "sampled": Sampling(max_tokens=TOOL_MAX_TOKENS, temperature=0.8,
                                                           seed=11)}  # fmt: skip
THINK_END = "</think>"
# room for a reasoning model's thinking before the answer; still thinking at the limit is "could not check"
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


def _chat(service: ServiceHandle, body: dict[str, Any]) -> Answer:
    """A chat answer (streamed when `body` says so), read by the client; a refusal naming --grammar-backend
    none fails naming seed 002, any other refusal is the ApiError."""
    try:
        return service.client.answer(CHAT_PATH, _chat_body(service, body))
    except ApiError as exc:
        _refused(service, str(exc))
        raise


def _calls(answer: Answer) -> str:
    return ", ".join(call.describe() for call in answer.tool_calls) or "no tool call at all"


def check_tool_calls(answer: Answer, wanted: str | None, *, what: str,
                     max_tokens: int = TOOL_MAX_TOKENS) -> None:
    """A forced call, complete: finish reason "tool_calls", calls of the given tools (`wanted`, where named)
    whose arguments are a JSON string valid under the tool's parameters. A call cut by max_tokens fails saying
    so: the call as received and the limit (a forced call that cannot finish serves no client)."""
    __tracebackhide__ = True
    if answer.error is not None:
        fail(f"{what}: an error event inside the stream (code {answer.error.code!r}): {answer.error.message}")
    if not answer.done:
        fail(f"{what}: the stream stopped without [DONE] after {len(answer.tool_calls)} tool call(s) "
             f"{_calls(answer)}")
    if answer.finish_reason is None:
        fail(f"{what}: the stream ended without a finish_reason (tool calls {_calls(answer)}, content "
             f"{answer.content[:120]!r})")
    if answer.problems:
        fail(f"{what}: malformed tool-call deltas: {'; '.join(answer.problems)[:600]}")
    tokens = answer.completion_tokens
    if tokens is not None and tokens > max_tokens:
        fail(f"{what}: the answer counts {tokens} completion tokens for max_tokens={max_tokens} "
             f"(finish_reason {answer.finish_reason!r}, {_calls(answer)})")
    if answer.finish_reason == "length":
        said = (answer.reasoning or "") + answer.content + "".join(
            str(c.arguments or "") for c in answer.tool_calls) + (
            "x" if answer.tool_calls else "")  # a call named is output, whatever its arguments
        if not said and tokens == max_tokens:  # the server's own count: max_tokens of output it did not give
            fail(f"{what}: the forced call was cut by max_tokens={max_tokens} (finish_reason 'length', "
                 f"{tokens} completion tokens) and the answer carries neither a tool call nor content: the "
                 "server withheld the incomplete call (real SGLang 0.5.17 does in a whole answer); a client "
                 "gets no usable call")
        if lie := length_problem(said, tokens, max_tokens):
            fail(f"{what}: the answer {lie}: a length finish is only a prefix when max_tokens cut it")
        if answer.reasoning and not answer.content and not answer.tool_calls:  # forced after the think-end
            could_not_check(still_reasoning(what, answer.reasoning, max_tokens, "forced call"))
        if not answer.tool_calls:
            fail(f"{what}: no tool call at all: the output ran to max_tokens={max_tokens} (finish_reason "
                 f"'length') as content {answer.content[:160]!r}: the forced call was never made")
        fail(f"{what}: the forced call was cut by max_tokens={max_tokens} (finish_reason 'length'): "
             f"{_calls(answer)} is not a complete call; a client gets no usable call")
    if answer.finish_reason != "tool_calls" or not answer.tool_calls:
        fail(f"{what}: expected finish_reason 'tool_calls' with tool calls, got finish_reason "
             f"{answer.finish_reason!r}, {_calls(answer)}, content {answer.content[:200]!r}")
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in answer.tool_calls:
        if call.name not in parameters or (wanted and call.name != wanted):
            fail(f"{what}: the call names {call.name!r}, not {wanted or ' or '.join(parameters)}: "
                 f"{call.describe()}")
        if not isinstance(call.id, str) or not call.id or call.type != "function":
            fail(f"{what}: the call has id {call.id!r} and type {call.type!r}: a client answers a call with "
                 f"a tool message naming its id, and OpenAI's calls are of type 'function': "
                 f"{call.describe()}")
        if not isinstance(call.arguments, str):
            fail(f"{what}: the arguments of {call.name!r} are {json_kind(call.arguments)}, not a JSON string "
                 f"(OpenAI's function.arguments; a client's json.loads breaks on it): {call.describe()}")
        try:
            arguments = loads_json(call.arguments, strict=False)
            jsonschema.validate(arguments, parameters[str(call.name)])
        except (ValueError, jsonschema.ValidationError) as exc:
            fail(f"{what}: the arguments of {call.name!r} {call.arguments!r:.200} break its parameters' "
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


def forced_tool_call(service: ServiceHandle, choice: ToolChoice, *, streamed: bool = False,
                     sampled: bool = False) -> None:
    """tool_choice "required" or a named function, whole or streamed, greedy or sampled: a complete call of a
    given tool, valid arguments."""
    __tracebackhide__ = True
    parser = parser_named(service, "--tool-call-parser", constrained=True)
    if disabled := backend_disabled(service):
        fail(f"{service.name}: {disabled}: tool_choice {choice!r} cannot be "
             f"forced; {SEED_002}")
    wanted = "add" if choice == "named" else None
    tool_choice: object = {"type": "function", "function": {"name": wanted}} if wanted else "required"
    sampling = room_to_think(TOOL_SAMPLINGS["sampled" if sampled else "greedy"], "chat",
                             service.served.reasoning_parser.value)
    body = {"tools": TOOLS, "tool_choice": tool_choice, **sampling.as_openai(), "stream": streamed}
    if streamed:  # the stream's token count (constrained_body says why)
        body["stream_options"] = {"include_usage": True}
    what = (f"{service.name}: tool_choice {json.dumps(tool_choice)} (--tool-call-parser {parser})"
            f"{' streamed' if streamed else ''}{' sampled' if sampled else ''}")
    try:
        answer = _chat(service, body)
    except ApiError as exc:
        fail(f"{what}: failed (refused, or the stream broke off): {exc}")
    check_tool_calls(answer, wanted, what=what, max_tokens=sampling.max_tokens)


def reasoning_separated(service: ServiceHandle) -> None:
    """reasoning_content + content are the whole output, split at </think>; the split loses nothing."""
    __tracebackhide__ = True
    parser = parser_named(service, "--reasoning-parser", constrained=False)
    body = {"max_tokens": 48, "ignore_eos": True}
    split = _chat(service, {**body, "separate_reasoning": True})
    unsplit = _chat(service, {**body, "separate_reasoning": False})
    whole = unsplit.content
    if not whole:  # 48 tokens with ignore_eos: an empty output is no output, and would split into nothing
        fail(f"{service.name} (--reasoning-parser {parser}): asked for 48 tokens with ignore_eos and "
             f"separate_reasoning false, the answer has no content (reasoning_content "
             f"{unsplit.reasoning!r:.200}, finish_reason {unsplit.finish_reason!r})")
    reasoning, content = split.reasoning, split.content
    what = f"{service.name} (--reasoning-parser {parser})"
    if reasoning is None and THINK_END in whole:
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


def check_reasoned(answer: Answer, grammar: Grammar, *, what: str, max_tokens: int) -> None:
    """The reasoning separated from the answer, the answer (content) complete and in the grammar's language.
    Still reasoning when max_tokens cut it (no content yet): "could not check", never a pass; content cut by
    max_tokens is judged as a prefix by a real grammar matcher."""
    __tracebackhide__ = True
    reasoning = answer.reasoning or ""
    if answer.error is not None:
        fail(f"{what}: an error event inside the stream (code {answer.error.code!r}): {answer.error.message}")
    if not answer.done:
        fail(f"{what}: the stream stopped without [DONE] after content {answer.content[-80:]!r}")
    if answer.finish_reason == "length":
        if lie := length_problem(reasoning + answer.content, answer.completion_tokens, max_tokens):
            fail(f"{what}: the answer {lie}: a length finish is only a prefix when max_tokens cut it")
        if not answer.content:
            could_not_check(still_reasoning(what, reasoning, max_tokens, "constrained answer"))
        if answer.completion_tokens is None:  # a stream cut short after a valid prefix reads the same
            could_not_check(f"{what}: finished by length after content {answer.content[:80]!r}, and the "
                            "answer says no token count: whether max_tokens cut it cannot be told")
        if problem := prefix_or_unchecked(grammar, answer.content, what=what):
            fail(f"{what}: finished by length after max_tokens={max_tokens}, and content "
                 f"{answer.content[:200]!r} {problem}")
        return  # content cut by max_tokens, a prefix of the language as the matcher says
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
    if disabled := backend_disabled(service):
        fail(f"{what}: {disabled}: the answer cannot be constrained; {SEED_002}")
    client = service.client
    path, body = constrained_body(client, "chat", grammar, REASONED, stream=streamed)
    try:
        answer = client.answer(path, body)
    except ApiError as exc:
        fail(f"{what}: failed (refused, or the stream broke off): {exc}")
    check_reasoned(answer, grammar, what=what, max_tokens=REASONED.max_tokens)
