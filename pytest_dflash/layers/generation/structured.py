"""Structured output: constrained requests (json_schema, regex, EBNF, response_format) and their validation.

Each case is one grammar in one API: native ``/generate`` ``sampling_params`` ``json_schema`` / ``regex`` /
``ebnf``, or chat ``response_format`` ``json_schema`` / ``json_object``. Every output must be in the grammar's
language (grammars.py says how each is judged). A finish by length is a prefix, not a violation: it passes
when a real grammar matcher says it is a prefix of the language, fails when it says it is not, and "could not
check" (naming the extra that installs one) when the controller has no matcher; a length finish with fewer
tokens than max_tokens by the answer's own count, or with no output at all, fails. An ``abort`` finish, an
error event inside the stream, a stream without ``[DONE]`` or output outside the language fails, naming the
grammar. Every answer is read once, by the client, into an `Answer` (client/answers.py).

A server that serves no grammar (``--grammar-backend none``, seed 002's fix; a DDTREE server sets it itself)
fails every case, naming the flag and the seed, unless its profile says ``structured_output = false``. Then
the same requests check that it says so: a refusal (HTTP 400 or 422; streamed, an ``abort`` finish with
status_code 400 or 422, as SGLang refuses a streamed /generate, or an error event with code 400 or 422 after
HTTP 200, as its serving_chat refuses a stream) passes, and so
does output in the grammar's language; a 200 whose output ignores the grammar (a client asking for JSON
silently gets text), another 4xx, a 5xx, a dropped connection or a death fails, naming the grammar.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pytest_dflash.client.answers import Answer
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.generation.grammars import (
    EBNF,
    GRAMMARS,
    REPLACEMENT,
    Grammar,
    MatcherMissing,
    ebnf_accepts,
)
from pytest_dflash.layers.generation.requests import PROMPT, Api, messages
from pytest_dflash.layers.generation.shapes import fail
from pytest_dflash.run.skips import could_not_check, needs_sglang

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

__all__ = [
    "EBNF",
    "GRAMMARS",
    "REPLACEMENT",
    "STRUCTURED_CASES",
    "Grammar",
    "backend_disabled",
    "check_outcome",
    "constrained_body",
    "ebnf_accepts",
    "prefix_or_unchecked",
    "refused_or_served",
    "send",
    "serves_structured_output",
    "still_reasoning",
    "structured_output",
    "unserved_problem",
]

NO_BACKEND_FLAG = "--grammar-backend none"
SEED_002 = ("seed 002: `--grammar-backend none` was the fix taken for an xgrammar without StructuralTag, "
            "and it silently turned off JSON mode, regex and EBNF constraints and tool-call forcing for "
            "every client")
REFUSALS = (400, 422)  # a request refused for what it asks (a 401, 404 or 429 says nothing about the grammar)
NOT_SERVED = "the profile says this service serves no structured output (structured_output = false)"

# suite parametrisation: (api, grammar) per case
STRUCTURED_CASES: dict[str, tuple[Api, str]] = {
    "generate-json_schema": ("generate", "json_schema"),
    "generate-regex": ("generate", "regex"),
    "generate-ebnf": ("generate", "ebnf"),
    "chat-response_format": ("chat", "response_format"),
    "chat-json_object": ("chat", "json_object"),
}
GREEDY = Sampling(max_tokens=160, temperature=0.0)
SAMPLED = Sampling(max_tokens=160, temperature=0.8, seed=11)
SMOKE = Sampling(max_tokens=48, temperature=0.0)  # a person object fits; cut, it is judged as a prefix
# Tokens a reasoning model may think before a chat answer (a served --reasoning-parser: SGLang applies a
# chat's grammar, and a forced call's, only after the think-end); thinking at the limit: "could not check".
THINKING_ROOM = 400


def room_to_think(sampling: Sampling, api: Api, reasoning_parser: str | int | None) -> Sampling:
    """`sampling` with THINKING_ROOM more max_tokens for a chat request to a service that serves a reasoning
    parser: its answer comes after the thinking. /generate returns the raw text, its grammar from the first
    token."""
    if api != "chat" or not reasoning_parser:
        return sampling
    return replace(sampling, max_tokens=sampling.max_tokens + THINKING_ROOM)


def completion_tokens(counts: Any) -> int | None:
    """`completion_tokens` of a `usage` or `meta_info` object, where it is an integer."""
    value = counts.get("completion_tokens") if isinstance(counts, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def length_problem(text: str, tokens: int | None, max_tokens: int) -> str | None:
    """What makes a length finish a lie: no output at all, or fewer tokens than max_tokens by the answer's own
    count (a server that says "length" early would pass every grammar as a prefix)."""
    if tokens is not None and tokens < max_tokens:
        return f"says finish_reason 'length' after {tokens} of max_tokens={max_tokens} tokens"
    if not text:
        return f"says finish_reason 'length' with no output at all (max_tokens={max_tokens})"
    return None


def still_reasoning(what: str, reasoning: str, max_tokens: int, given: str) -> str:
    """Why a check could not judge an answer whose reasoning max_tokens cut (no content yet)."""
    return (f"{what}: still reasoning when max_tokens={max_tokens} cut the output (reasoning "
            f"{reasoning[-80:]!r}, no content): the {given} after the reasoning was never given")


def constrained_body(client: InferenceClient, api: Api, grammar: Grammar, sampling: Sampling, *,
                     stream: bool) -> tuple[str, dict[str, Any]]:
    """The path and body of one constrained request."""
    if api == "generate":
        params = {**sampling.as_sglang(), grammar.param: grammar.value}
        return "/generate", {"text": PROMPT, "sampling_params": params, "stream": stream}
    body: dict[str, Any] = {"model": client.model(), "messages": messages(PROMPT), **sampling.as_openai(),
                            grammar.param: grammar.value}  # fmt: skip
    if stream:  # the usage chunk is the stream's token count: without it a stream cut short by a 'length'
        body["stream"] = True  # finish after a valid prefix passes as a prefix (length_problem)
        body["stream_options"] = {"include_usage": True}
    return "/v1/chat/completions", body


def send(client: InferenceClient, api: Api, grammar: Grammar, sampling: Sampling, *, stream: bool) -> Answer:
    """One constrained request, streamed or not, as the client's typed Answer; ApiError on an HTTP refusal."""
    path, body = constrained_body(client, api, grammar, sampling, stream=stream)
    return client.answer(path, body)


def prefix_or_unchecked(grammar: Grammar, text: str, *, what: str) -> str | None:
    """`grammar.prefix_problem(text)`; "could not check" (the extra named) when the controller has no
    grammar matcher: a cut output is never passed as a prefix unjudged."""
    __tracebackhide__ = True
    try:
        return grammar.prefix_problem(text)
    except MatcherMissing as exc:
        could_not_check(f"{what}: finished by length, so only a prefix can be asked of it: {exc}")


def backend_disabled(service: ServiceHandle) -> str | None:
    """Where the service says its grammar backend is off (`--grammar-backend none`), or None: /server_info's
    resolved `grammar_backend` where SGLang says it (an attached server, a DDTREE server that turns it off
    itself), else the command's flag (`ServiceHandle.served`)."""
    served = service.served.grammar_backend
    if served.value != "none":
        return None
    if served.command == "none":  # the flag to remove is the news, whether or not /server_info echoes it
        return f"its command has `{NO_BACKEND_FLAG}`"
    return "its /server_info says grammar_backend = none"


def structured_output(service: ServiceHandle, api: Api, grammar_name: str, *, sampled: bool,
                      streamed: bool) -> None:
    """One constrained request: a complete output in the grammar's language, or the failure naming it."""
    __tracebackhide__ = True
    if api == "generate":
        needs_sglang(service, "a constrained request through SGLang's native /generate")
    _constrained(service, api, GRAMMARS[grammar_name], SAMPLED if sampled else GREEDY, streamed=streamed)


def serves_structured_output(service: ServiceHandle) -> None:
    """The deploy gate's one constrained request (smoke): a greedy json_schema, native /generate where served,
    else chat response_format, with little room (SMOKE). A server without a grammar backend, or one that
    ignores the grammar, fails unless its profile says structured_output = false (then it must refuse)."""
    __tracebackhide__ = True
    api: Api = "generate" if service.native else "chat"
    _constrained(service, api, GRAMMARS["json_schema" if service.native else "response_format"], SMOKE,
                 streamed=False)


def _constrained(service: ServiceHandle, api: Api, grammar: Grammar, sampling: Sampling, *,
                 streamed: bool) -> None:
    __tracebackhide__ = True
    sampled = sampling.temperature > 0
    what = (f"{service.name}: {grammar.describe()} via {api}{' streamed' if streamed else ''} "
            f"({'sampled' if sampled else 'greedy'})")
    if not service.spec.structured_output:
        refused_or_served(service, api, grammar, sampling, streamed=streamed, what=what)
        return
    if disabled := backend_disabled(service):
        fail(f"{service.name}: {disabled}: every constrained request "
             f"({grammar.describe()}) is refused, JSON mode and tool-call forcing are off for every client; "
             f"{SEED_002}. Say `structured_output = false` in its profile if that is intended")
    sampling = room_to_think(sampling, api, service.served.reasoning_parser.value)
    try:
        answer = send(service.client, api, grammar, sampling, stream=streamed)
    except ApiError as exc:
        if NO_BACKEND_FLAG in str(exc):
            _refused_as_no_backend(service, grammar, str(exc))
        fail(f"{service.name}: {grammar.describe()} via {api} failed (refused, or the stream broke off): "
             f"{exc}")
    refusal = answer.error.message if answer.error else answer.finish_message
    if (answer.error or answer.finish_reason == "abort") and NO_BACKEND_FLAG in (refusal or ""):
        # SGLang 0.5.17 refuses a streamed one in-band: /generate an abort after one token (recorded), chat
        # an error event with code 400 after HTTP 200 (serving_chat)
        _refused_as_no_backend(service, grammar, f"refused in the stream: {refusal}")
    check_outcome(answer, grammar, what=what, max_tokens=sampling.max_tokens)


def _refused_as_no_backend(service: ServiceHandle, grammar: Grammar, answer: str) -> None:
    __tracebackhide__ = True
    fail(f"{service.name}: the server refuses {grammar.describe()} as launched with `{NO_BACKEND_FLAG}` "
         f"(its command does not say so: a DDTREE server sets it itself): {answer}; {SEED_002}. Say "
         "`structured_output = false` in its profile if that is intended")


def refused_or_served(service: ServiceHandle, api: Api, grammar: Grammar, sampling: Sampling, *,
                      streamed: bool, what: str) -> None:
    """A service whose profile says it serves no structured output: it must refuse a constrained request
    (HTTP 400 / 422; streamed, an abort finish or an error event with code 400 / 422), or serve it right;
    never answer 200 with output that ignores the grammar."""
    __tracebackhide__ = True
    why = "its profile says structured_output = false, so a constrained request must be refused (HTTP 400)"
    sampling = room_to_think(sampling, api, service.served.reasoning_parser.value)
    try:
        answer = send(service.client, api, grammar, sampling, stream=streamed)
    except ApiError as exc:
        if exc.status in REFUSALS:
            return  # refused, as SGLang refuses under --grammar-backend none: the client is told
        if exc.status is not None and 400 <= exc.status < 500:
            fail(f"{what}: {why}, got {exc}: HTTP {exc.status} is no refusal of the request (that is 400 or "
                 "422); it says nothing about the grammar")
        fail(f"{what}: {why}, got {exc}")
    try:
        problem = unserved_problem(answer, grammar, sampling.max_tokens)
    except MatcherMissing as exc:
        could_not_check(f"{what}: accepted, and finished by length: {exc}")
    if problem is None:
        return
    fail(f"{what}: accepted and answered {answer.content[:160]!r} (finish_reason {answer.finish_reason!r}), "
         f"which {problem}: a client asking for this grammar silently gets unconstrained output; {why}")


def unserved_problem(answer: Answer, grammar: Grammar, max_tokens: int) -> str | None:
    """What is wrong with an answer a service that serves no structured output gave to a constrained request
    it accepted; None for a refusal inside the stream (an abort with status 400 / 422, as SGLang refuses a
    streamed /generate under --grammar-backend none, or an error event with code 400 / 422, as its
    serving_chat refuses a streamed chat: the client is told) or output in the grammar's language (served
    after all). MatcherMissing when a length finish needs a matcher the controller lacks."""
    if answer.error is not None:
        if answer.error.code in REFUSALS:
            return None
        return (f"is an error event inside the stream with code {answer.error.code!r} "
                f"({answer.error.message}), no refusal of the request (that is 400 or 422)")
    if answer.finish_reason == "abort":
        if answer.finish_status in REFUSALS:
            return None  # SGLang's in-stream refusal: an abort with status_code 400 (recorded)
        return (f"is an abort with status {answer.finish_status!r} ({answer.finish_message}), no refusal of "
                "the request (that is an abort with status 400 or 422)")
    if not answer.done:
        return "the stream stopped without [DONE]"
    if answer.finish_reason == "length":  # cut by max_tokens: a prefix is all it can be
        return (length_problem(answer.content, answer.completion_tokens, max_tokens)
                or grammar.prefix_problem(answer.content))
    return grammar.problem(answer.content)


def check_outcome(answer: Answer, grammar: Grammar, *, what: str, max_tokens: int) -> None:
    """A finished, complete output in the grammar's language; one cut by max_tokens a prefix of it, as a real
    grammar matcher says ("could not check" without one)."""
    __tracebackhide__ = True
    text = answer.content
    if answer.error is not None:
        fail(f"{what}: an error event inside the stream (code {answer.error.code!r}): {answer.error.message} "
             f"after {text[-80:]!r}")
    if not answer.done:
        fail(f"{what}: the stream stopped without [DONE] after {text[-80:]!r}")
    if answer.finish_reason == "length":
        reasoning = answer.reasoning or ""
        if lie := length_problem(reasoning + text, answer.completion_tokens, max_tokens):
            fail(f"{what}: the answer {lie}: a length finish is only a prefix when max_tokens cut it")
        if reasoning and not text:  # a --reasoning-parser grammar holds only after the think-end
            could_not_check(still_reasoning(what, reasoning, max_tokens, "constrained answer"))
        if answer.completion_tokens is None:  # a stream cut short after a valid prefix reads the same
            could_not_check(f"{what}: finished by length after {text[:80]!r}, and the answer says no token "
                            "count (usage, meta_info; a stream's usage chunk was asked): whether max_tokens "
                            "cut it cannot be told")
        if problem := prefix_or_unchecked(grammar, text, what=what):
            fail(f"{what}: finished by length after max_tokens={max_tokens}, and the output "
                 f"{text[:200]!r} {problem}")
        return  # a prefix of the language, as the matcher says: all a cut output can be asked
    if answer.finish_reason != "stop":
        detail = f" ({answer.finish_message})" if answer.finish_message else ""
        fail(f"{what}: finish_reason {answer.finish_reason!r}{detail} after {text[:120]!r}: a "
             "constrained request must end by its grammar (stop) or by length")
    problem = grammar.problem(text)
    if problem:
        fail(f"{what}: the output {text[:200]!r} {problem}")
