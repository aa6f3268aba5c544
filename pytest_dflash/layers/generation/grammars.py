"""The grammars of the structured-output checks and how an output is judged against one.

A whole output: JSON Schema by the jsonschema library, a regex by a full match, EBNF by xgrammar's matcher
where it is importable, else by the case's equivalent regex (the two agree: tests/layers/generation). An
output cut by max_tokens can only be asked to be a prefix of the language, and only a real grammar matcher
decides that: the controller's xgrammar, SGLang's own backend (llguidance, tried as a lighter judge, takes
raw control characters inside JSON strings, which xgrammar lets in, as outside the language: it would fail
healthy servers). Without xgrammar the judgement cannot be made: `MatcherMissing`, which the check turns into
"could not check" naming the extra that installs it (`GRAMMAR_EXTRA`), never a pass.

The text judged is the decoding of the bytes the grammar constrained: a byte-level token that ends inside a
multi-byte character decodes to U+FFFD, one per stray byte (SGLang 0.5.17 answered a 12-character maxLength
with '"river(Ti is\\ufffd\\ufffd"', tests/data/sglang-0.5.17-h100-structured). A character takes at most 4
bytes, so a run of k U+FFFD stands for at least ceil(k/4) characters: it is judged as that many, never as one
(60 U+FFFD do not pass maxLength 12, nor 11 letters and 13 U+FFFD).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from pytest_dflash.documents import loads_json
from pytest_dflash.scrub.bounds import clip

__all__ = ["EBNF", "GRAMMARS", "GRAMMAR_EXTRA", "PERSON", "REPLACEMENT", "Grammar", "MatcherMissing",
           "ebnf_accepts", "fewest_characters"]

REPLACEMENT = "\ufffd"  # what a decoder shows for bytes that are not UTF-8
UTF8_MAX_BYTES = 4
GRAMMAR_EXTRA = "pip install 'pytest-dflash[grammar]'"
EBNF = 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe"'

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 999}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class MatcherMissing(Exception):
    """No grammar matcher on the controller: a prefix judgement cannot be made."""

    def __init__(self, judged: str) -> None:
        super().__init__(f"judging {judged} needs xgrammar's grammar matcher, and the controller has none: "
                         f"{GRAMMAR_EXTRA}")


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
        return f"{self.name} {clip(shown, 160)!r}"  # never cut inside a word (issue 41)

    def problem(self, text: str) -> str | None:
        """What is wrong with `text` under this grammar, or None when it is in the language."""
        return self._problem(fewest_characters(text))

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
        prefix can be asked of it), or None: it is one. MatcherMissing when no matcher can tell."""
        accepted = _xgrammar_prefix(self, fewest_characters(text))
        if accepted is None:
            raise MatcherMissing(f"a {self.name} output cut by max_tokens")
        return None if accepted else "is not even a prefix of the grammar's language (xgrammar's matcher)"


def fewest_characters(text: str) -> str:
    """`text` with each run of k U+FFFD shortened to ceil(k/4): the fewest characters those bytes can be."""
    if REPLACEMENT not in text:
        return text
    return re.sub(f"{REPLACEMENT}+", lambda run: REPLACEMENT * -(-len(run.group()) // UTF8_MAX_BYTES), text)


def _xgrammar_prefix(grammar: Grammar, text: str) -> bool | None:
    """Whether xgrammar's matcher takes `text` as a prefix of the language; None without xgrammar."""
    try:
        import xgrammar
        from xgrammar.testing import _is_grammar_accept_string
    except ImportError:
        return None
    if grammar.schema is not None:  # lenient: any whitespace, extra properties (a server may be stricter)
        compiled = xgrammar.Grammar.from_json_schema(json.dumps(grammar.schema), any_whitespace=True,
                                                     strict_mode=False)
    elif grammar.ebnf is not None:
        compiled = xgrammar.Grammar.from_ebnf(grammar.ebnf)
    elif grammar.param == "regex":
        compiled = xgrammar.Grammar.from_regex(str(grammar.value))
    else:
        raise MatcherMissing(f"a {grammar.name} output cut by max_tokens")  # no grammar to build: no judge
    return bool(_is_grammar_accept_string(compiled, text, require_termination=False))


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
