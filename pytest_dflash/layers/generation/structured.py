"""Structured output: constrained requests (json_schema, regex, EBNF, response_format) and their validation.

Each case is one grammar in one API: native ``/generate`` ``sampling_params`` ``json_schema`` / ``regex`` /
``ebnf``, or chat ``response_format`` ``json_schema`` / ``json_object``. Every output must be in the grammar's
language: JSON Schema by the jsonschema library, a regex by a full match, EBNF by xgrammar's own matcher where
it is importable, else by the case's equivalent regex (the two agree: tests/layers/generation). A finish by
length is a prefix, not a violation: reported as such (a warning), never as invalid. An ``abort`` finish, a
stream without ``[DONE]`` or output outside the language fails, naming the grammar.

A server that serves no grammar (``--grammar-backend none``, seed 002's fix; a DDTREE server sets it itself)
fails every case, naming the flag and the seed, unless its profile says ``structured_output = false``. Then
the same requests check that it says so: a refusal (HTTP 400 or 422, or an ``abort`` finish) passes, and so
does output in the grammar's language; a 200 whose output ignores the grammar (a client asking for JSON
silently gets text), another 4xx, a 5xx, a dropped connection or a death fails, naming the grammar.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema  # type: ignore[import-untyped]

from pytest_dflash.client.bodies import answer_json, chat_choice, error_message, native_answer
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.documents import loads_json
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.generation.requests import PROMPT, Api, messages
from pytest_dflash.layers.generation.shapes import fail
from pytest_dflash.run.skips import needs_sglang

if TYPE_CHECKING:
    from pytest_dflash.config.profiles import ServiceSpec
    from pytest_dflash.run.state import ServiceHandle

__all__ = [
    "GRAMMARS",
    "STRUCTURED_CASES",
    "Grammar",
    "Outcome",
    "backend_disabled",
    "constrained_body",
    "ebnf_accepts",
    "refused_or_served",
    "structured_output",
    "unserved_problem",
]

NO_BACKEND_FLAG = "--grammar-backend none"
SEED_002 = ("seed 002: `--grammar-backend none` was the fix taken for an xgrammar without StructuralTag, "
            "and it silently turned off JSON mode, regex and EBNF constraints and tool-call forcing for "
            "every client")
REFUSALS = (400, 422)  # a request refused for what it asks (a 401, 404 or 429 says nothing about the grammar)
NOT_SERVED = "the profile says this service serves no structured output (structured_output = false)"
REPLACEMENT = "\ufffd"  # what a decoder shows for bytes that are not UTF-8
EBNF = 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe"'


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 999}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class GrammarWarning(UserWarning):
    """A constrained output ended by length: a prefix of the language, not checked as complete."""


@dataclass(frozen=True)
class Grammar:
    """One constraint: how a request carries it and how an output is checked against it."""

    name: str
    param: str  # the sampling param ("json_schema", "regex", "ebnf") or "response_format"
    value: Any
    schema: dict[str, Any] | None = None  # JSON outputs: the schema they validate against
    pattern: str | None = None  # a regex the whole output must match (an EBNF's language as a regex)
    ebnf: str | None = None

    def describe(self) -> str:
        shown = self.value if isinstance(self.value, str) else json.dumps(self.value)
        return f"{self.name} {shown[:160]!r}"

    def problem(self, text: str) -> str | None:
        """What is wrong with `text` under this grammar, or None when it is in the language."""
        return _judged_lossless(self._problem, text)

    def _problem(self, text: str) -> str | None:
        if self.schema is not None:
            try:
                # strict=False: xgrammar's JSON grammar lets raw control characters into strings
                document = loads_json(text, strict=False)
            except ValueError as exc:
                return f"not JSON ({exc})"
            try:
                jsonschema.validate(document, self.schema)
            except jsonschema.ValidationError as exc:
                return f"breaks the schema: {exc.message}"
            return None
        if self.ebnf is not None:
            accepted = ebnf_accepts(self.ebnf, text)
            if accepted is not None:
                return None if accepted else "not in the EBNF grammar's language (xgrammar's matcher)"
        if self.pattern is not None and re.fullmatch(self.pattern, text) is None:
            return f"does not fully match {self.pattern!r}"
        return None

    def prefix_problem(self, text: str) -> str | None:
        """What makes `text` not even a prefix of the language (a length finish cut the output, so only a
        prefix can be asked of it), or None: it may be one, or xgrammar (which decides it) is missing."""
        return _judged_lossless(self._prefix_problem, text)

    def _prefix_problem(self, text: str) -> str | None:
        try:
            import xgrammar
            from xgrammar.testing import _is_grammar_accept_string
        except ImportError:
            return None
        if self.schema is not None:  # lenient: any whitespace, extra properties (a server may be stricter)
            grammar = xgrammar.Grammar.from_json_schema(json.dumps(self.schema), any_whitespace=True,
                                                        strict_mode=False)
        elif self.ebnf is not None:
            grammar = xgrammar.Grammar.from_ebnf(self.ebnf)
        elif self.param == "regex":
            grammar = xgrammar.Grammar.from_regex(str(self.value))
        else:
            return None
        if _is_grammar_accept_string(grammar, text, require_termination=False):
            return None
        return "is not even a prefix of the grammar's language (xgrammar's matcher)"


def _judged_lossless(judge: Callable[[str], str | None], text: str) -> str | None:
    """`judge(text)`, where a run of U+FFFD may stand for one character. The grammar constrains the bytes; the
    text is their decoding, and a byte-level token that ends inside a multi-byte character decodes to
    replacement characters, one per stray byte: real SGLang 0.5.17 answered a json_schema with a 12-character
    maxLength with '"river(Ti is\ufffd\ufffd"' (tests/data/sglang-0.5.17-h100-structured). Text without
    U+FFFD is judged as it is."""
    problem = judge(text)
    if problem is None or REPLACEMENT not in text:
        return problem
    return None if judge(re.sub(f"{REPLACEMENT}+", REPLACEMENT, text)) is None else problem


def ebnf_accepts(ebnf: str, text: str) -> bool | None:
    """Whether xgrammar's matcher accepts `text` as a whole under `ebnf`; None without xgrammar."""
    try:
        import xgrammar
        from xgrammar.testing import _is_grammar_accept_string
    except ImportError:
        return None
    return bool(_is_grammar_accept_string(xgrammar.Grammar.from_ebnf(ebnf), text))


GRAMMARS: dict[str, Grammar] = {
    "json_schema": Grammar("json_schema", "json_schema", json.dumps(PERSON), schema=PERSON),
    "regex": Grammar("regex", "regex", r"[a-z]{3}-[0-9]{2}", pattern=r"[a-z]{3}-[0-9]{2}"),
    "ebnf": Grammar("ebnf", "ebnf", EBNF, pattern=r"(yes|no|maybe)\.", ebnf=EBNF),
    "response_format": Grammar("response_format json_schema", "response_format",
                               {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
                               schema=PERSON),
    "json_object": Grammar("response_format json_object", "response_format", {"type": "json_object"},
                           schema={"type": "object"}),
}  # fmt: skip

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


@dataclass(frozen=True)
class Outcome:
    """A constrained request's answer: the text, its finish reason, whether a stream ended with [DONE]."""

    text: str
    finish_reason: str | None
    done: bool = True
    message: str | None = None  # an abort's message, where the server gave one
    tokens: int | None = None  # the completion tokens the answer counts, where it says


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


def constrained_body(client: InferenceClient, api: Api, grammar: Grammar, sampling: Sampling, *,
                     stream: bool) -> tuple[str, dict[str, Any]]:
    """The path and body of one constrained request."""
    if api == "generate":
        params = {**sampling.as_sglang(), grammar.param: grammar.value}
        return "/generate", {"text": PROMPT, "sampling_params": params, "stream": stream}
    body: dict[str, Any] = {"model": client.model(), "messages": messages(PROMPT), **sampling.as_openai(),
                            grammar.param: grammar.value}  # fmt: skip
    if stream:
        body["stream"] = True
    return "/v1/chat/completions", body


def send(client: InferenceClient, api: Api, grammar: Grammar, sampling: Sampling, *, stream: bool) -> Outcome:
    """One constrained request, streamed or not, as an Outcome; ApiError on a refusal."""
    path, body = constrained_body(client, api, grammar, sampling, stream=stream)
    if stream:
        streamed = client.stream(path, body)
        return streamed_outcome(streamed.events, api, done=streamed.done)
    response = client.request("POST", path, json_body=body)
    if response.status_code >= 400:
        raise ApiError(client.service, path, response.status_code, error_message(response),
                       response.text[:500])
    data = answer_json(response, client.service, path)
    if api == "generate":
        answer = native_answer(data, client.service)
        reason = answer["meta_info"].get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        message = reason.get("message") if isinstance(reason, dict) else None
        return Outcome(str(answer.get("text", "")), kind, message=message,
                       tokens=completion_tokens(answer["meta_info"]))
    choice = chat_choice(data, client.service, path)
    return Outcome(str(choice["message"].get("content") or ""), choice.get("finish_reason"),
                   tokens=completion_tokens(data.get("usage")))


def streamed_outcome(events: Sequence[dict[str, Any]], api: Api, *, done: bool) -> Outcome:
    text, reason, message, tokens = "", None, None, None
    for event in events:
        if api == "generate":
            text = str(event.get("text", text))
            meta = event.get("meta_info")
            finish = meta.get("finish_reason") if isinstance(meta, dict) else None
            tokens = completion_tokens(meta) if isinstance(meta, dict) else tokens
            if finish:
                reason = finish.get("type") if isinstance(finish, dict) else finish
                message = finish.get("message") if isinstance(finish, dict) else None
            continue
        tokens = completion_tokens(event.get("usage")) or tokens
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text += str((delta if isinstance(delta, dict) else {}).get("content") or "")
            reason = choice.get("finish_reason") or reason
    return Outcome(text, reason, done, message, tokens)


def backend_disabled(spec: ServiceSpec) -> bool:
    """True when the service's command turns the grammar backend off (`--grammar-backend none`)."""
    command = list(spec.command)
    for i, part in enumerate(command):
        if part == "--grammar-backend" and i + 1 < len(command) and command[i + 1] == "none":
            return True
        if part == "--grammar-backend=none":
            return True
    return False


def structured_output(service: ServiceHandle, api: Api, grammar_name: str, *, sampled: bool,
                      streamed: bool) -> None:
    """One constrained request: a complete output in the grammar's language, or the failure naming it."""
    __tracebackhide__ = True
    if api == "generate":
        needs_sglang(service, "a constrained request through SGLang's native /generate")
    grammar = GRAMMARS[grammar_name]
    sampling = SAMPLED if sampled else GREEDY
    what = (f"{service.name}: {grammar.describe()} via {api}{' streamed' if streamed else ''} "
            f"({'sampled' if sampled else 'greedy'})")
    if not service.spec.structured_output:
        refused_or_served(service, api, grammar, sampling, streamed=streamed, what=what)
        return
    if backend_disabled(service.spec):
        fail(f"{service.name}: its command has `{NO_BACKEND_FLAG}`: every constrained request "
             f"({grammar.describe()}) is refused, JSON mode and tool-call forcing are off for every client; "
             f"{SEED_002}. Say `structured_output = false` in its profile if that is intended")
    try:
        outcome = send(service.client, api, grammar, sampling, stream=streamed)
    except ApiError as exc:
        if NO_BACKEND_FLAG in str(exc):
            _refused_as_no_backend(service, grammar, str(exc))
        fail(f"{service.name}: {grammar.describe()} via {api} failed (refused, or the stream broke off): "
             f"{exc}")
    if outcome.finish_reason == "abort" and NO_BACKEND_FLAG in (outcome.message or ""):
        # SGLang 0.5.17 refuses a streamed one in-band: HTTP 200, one token, then this abort (recorded)
        _refused_as_no_backend(service, grammar, f"finish_reason abort: {outcome.message}")
    check_outcome(outcome, grammar, what=what, max_tokens=sampling.max_tokens)


def _refused_as_no_backend(service: ServiceHandle, grammar: Grammar, answer: str) -> None:
    __tracebackhide__ = True
    fail(f"{service.name}: the server refuses {grammar.describe()} as launched with `{NO_BACKEND_FLAG}` "
         f"(its command does not say so: a DDTREE server sets it itself): {answer}; {SEED_002}. Say "
         "`structured_output = false` in its profile if that is intended")


def refused_or_served(service: ServiceHandle, api: Api, grammar: Grammar, sampling: Sampling, *,
                      streamed: bool, what: str) -> None:
    """A service whose profile says it serves no structured output: it must refuse a constrained request
    (4xx, or an abort finish), or serve it right; never answer 200 with output that ignores the grammar."""
    __tracebackhide__ = True
    why = "its profile says structured_output = false, so a constrained request must be refused (HTTP 400)"
    try:
        outcome = send(service.client, api, grammar, sampling, stream=streamed)
    except ApiError as exc:
        if exc.status in REFUSALS:
            return  # refused, as SGLang refuses under --grammar-backend none: the client is told
        if exc.status is not None and 400 <= exc.status < 500:
            fail(f"{what}: {why}, got {exc}: HTTP {exc.status} is no refusal of the request (that is 400 or "
                 "422); it says nothing about the grammar")
        fail(f"{what}: {why}, got {exc}")
    if (problem := unserved_problem(outcome, grammar, sampling.max_tokens)) is None:
        return
    fail(f"{what}: accepted and answered {outcome.text[:160]!r} (finish_reason {outcome.finish_reason!r}), "
         f"which {problem}: a client asking for this grammar silently gets unconstrained output; {why}")


def unserved_problem(outcome: Outcome, grammar: Grammar, max_tokens: int) -> str | None:
    """What is wrong with an answer a service that serves no structured output gave to a constrained request
    it accepted; None for an abort (refused in-band, as SGLang refuses a streamed one under
    --grammar-backend none: the client is told) or output in the grammar's language (served after all)."""
    if outcome.finish_reason == "abort":
        return None
    if not outcome.done:
        return "the stream stopped without [DONE]"
    if outcome.finish_reason == "length":  # cut by max_tokens: a prefix is all it can be
        return (length_problem(outcome.text, outcome.tokens, max_tokens)
                or grammar.prefix_problem(outcome.text))
    return grammar.problem(outcome.text)


def check_outcome(outcome: Outcome, grammar: Grammar, *, what: str, max_tokens: int) -> None:
    """A finished, complete output in the grammar's language; a length finish is reported, not judged."""
    __tracebackhide__ = True
    if not outcome.done:
        fail(f"{what}: the stream stopped without [DONE] after {outcome.text[-80:]!r}")
    if outcome.finish_reason == "length":
        if lie := length_problem(outcome.text, outcome.tokens, max_tokens):
            fail(f"{what}: the answer {lie}: a length finish is only a prefix when max_tokens cut it")
        if problem := grammar.prefix_problem(outcome.text):
            fail(f"{what}: finished by length after max_tokens={max_tokens}, and the output "
                 f"{outcome.text[:200]!r} {problem}")
        warnings.warn(GrammarWarning(f"{what}: finished by length after max_tokens={max_tokens}: a prefix, "
                                     f"not checked as complete: {outcome.text[:80]!r}…"), stacklevel=2)
        return
    if outcome.finish_reason != "stop":
        detail = f" ({outcome.message})" if outcome.message else ""
        fail(f"{what}: finish_reason {outcome.finish_reason!r}{detail} after {outcome.text[:120]!r}: a "
             "constrained request must end by its grammar (stop) or by length")
    problem = grammar.problem(outcome.text)
    if problem:
        fail(f"{what}: the output {outcome.text[:200]!r} {problem}")
