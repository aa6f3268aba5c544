"""Constrained decoding (json_schema, regex, ebnf) with xgrammar on CPU, as SGLang 0.5.17 serves it.

The grammar backend is built from the refserver's own byte vocabulary (model.py): tokens 0-255 are one
byte each, the special tokens decode to nothing (xgrammar never allows them) except the EOS ids, which
are the grammar's stop tokens. xgrammar is imported on the first constrained request, not at start-up:
every refserver would otherwise pay its import (transformers) whether a client asks for a grammar or not.

Where the masks apply is SGLang's: NONE masks the target's row before it chooses; a speculative verify
(DFLASH's chain: ``GrammarTree.from_linear_chain`` + ``build_grammar_vocab_mask`` in dflash_worker_v2.py;
EAGLE's and DDTREE's trees) walks the draft with the matcher to build one mask per verified row, the
target chooses from each masked row, then the matcher is rolled back to the last committed token and
takes the emitted tokens. A token the matcher refuses ends the request with an abort, as SGLang's
"Grammar accept_token failed". The fault ``grammar-rollback-bug`` leaves the first rejected draft token
in the matcher (a missed rollback): output breaks the grammar under speculation, never under NONE.

Reasoning (SGLang's ReasonerGrammarBackend, wrapped around the backend when ``--reasoning-parser`` is set):
a request that reasons (``require_reasoning``: a chat under the parser) gets a ``ThinkPhase`` in front of
its matcher. Until the think-end token sequence (``</think>``'s bytes) is out, no grammar applies and no
token reaches the matcher; from the token after it, the grammar holds. Masks, the verify's tree walk and
rollbacks go through the phase the same way (a rollback across the think-end re-opens the thinking), so the
answer is constrained and lossless under speculation. The refserver's random model never closes its thinking
by itself, so the phase is SGLang's strict thinking with ``SGLANG_MAX_THINK_TOKENS``: after ``THINK_TOKENS``
tokens only the next think-end token is allowed, and EOS is never allowed while thinking (qwen3's
``think_excluded_tokens``), so a constrained answer always follows.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_dflash.refserver.model import EOS_IDS, SPECIAL_TOKENS, VOCAB_SIZE

__all__ = [
    "GRAMMAR_KINDS",
    "NO_BACKEND",
    "THINK_TOKENS",
    "Constraint",
    "GrammarBackend",
    "InvalidGrammar",
    "ThinkPhase",
    "grammar_key",
    "response_format_schema",
]

logger = logging.getLogger("pytest_dflash.refserver")

THINK_TOKENS = 24  # tokens of reasoning before the think-end is forced (SGLANG_MAX_THINK_TOKENS)
GRAMMAR_KINDS = {"json_schema": "json", "regex": "regex", "ebnf": "ebnf"}  # sampling param -> SGLang's key
_KEY_PARAM = {kind: param for param, kind in GRAMMAR_KINDS.items()}
# SGLang's GrammarManager, word for word: the abort (HTTP 400) of a constrained request on a server started
# with --grammar-backend none.
NO_BACKEND = (
    "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported when the server "
    "is launched with --grammar-backend none"
)


class InvalidGrammar(ValueError):
    """A constrained request SGLang answers with HTTP 400; the message is SGLang's (params.py: BadRequest)."""


def grammar_key(raw: dict[str, Any]) -> tuple[str, str] | None:
    """SGLang's grammar key of a request's sampling params: json_schema before regex before ebnf."""
    if raw.get("structural_tag") is not None:
        raise InvalidGrammar("structural_tag is not supported by this server.")
    for param, kind in GRAMMAR_KINDS.items():
        value = raw.get(param)
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidGrammar(f"{param} must be a string, got {type(value).__name__}.")
        return kind, value
    return None


def response_format_schema(response_format: object) -> str | None:
    """The json_schema an OpenAI ``response_format`` asks for (SGLang serving_chat's mapping)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise InvalidGrammar("response_format must be an object.")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return '{"type": "object"}'
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "name" not in spec:
            raise InvalidGrammar("response_format.json_schema must be an object with a name.")
        schema = spec.get("schema", spec.get("schema_"))
        return json.dumps(schema if schema is not None else {})
    raise InvalidGrammar(f"Unsupported response_format type: {kind!r}.")


class GrammarBackend:
    """xgrammar's compiler over the byte vocabulary, with SGLang's cache of compiled grammars by key."""

    def __init__(self, *, any_whitespace: bool = True, think_end_ids: tuple[int, ...] = ()) -> None:
        self.any_whitespace = any_whitespace  # SGLang: not --constrained-json-disable-any-whitespace
        # SGLang's ReasonerGrammarBackend: set with --reasoning-parser (the parser's think-end token ids)
        self.think_end_ids = think_end_ids
        self._compiler: Any = None
        self._cache: dict[tuple[str, str], Any] = {}

    def compile(self, key: tuple[str, str]) -> Any:
        """The compiled grammar of a key; a BadRequest with SGLang's message when it does not compile."""
        if key in self._cache:
            return self._cache[key]
        compiler = self._compiler_once()
        kind, value = key
        try:
            if kind == "json":
                json.loads(value)  # SGLang's xgrammar backend: a schema that is not JSON is invalid
                compiled = compiler.compile_json_schema(value, any_whitespace=self.any_whitespace)
            elif kind == "regex":
                compiled = compiler.compile_regex(value)
            else:
                compiled = compiler.compile_grammar(value)
        except (RuntimeError, ValueError) as e:
            # SGLang 0.5.17's words (recorded): the log line, then xgrammar's own message in the 400
            logger.warning("Hit invalid %s: key_string=%r, e=%r", _KEY_PARAM[kind], value, e)
            raise InvalidGrammar(f"Failed to compile {kind} grammar: {e}") from None
        self._cache[key] = compiled
        return compiled

    def constraint(self, key: tuple[str, str], *, reasoning: bool = False) -> Constraint:
        """A request's matcher; behind a think phase when it reasons and the backend has a think-end."""
        import xgrammar

        think = ThinkPhase(self.think_end_ids) if reasoning and self.think_end_ids else None
        return Constraint(key, xgrammar.GrammarMatcher(self.compile(key)), think=think)

    def _compiler_once(self) -> Any:
        if self._compiler is None:
            import xgrammar

            specials = set(SPECIAL_TOKENS.values())
            # special tokens decode to b"": xgrammar never allows them, except the stop tokens
            vocab = [b"" if i in specials else bytes([i]) for i in range(VOCAB_SIZE)]
            info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=VOCAB_SIZE,
                                          stop_token_ids=list(EOS_IDS))  # fmt: skip
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        return self._compiler


@dataclass
class ThinkPhase:
    """SGLang's ReasonerGrammarObject state: thinking until the think-end sequence is out, then the answer.

    ``matched`` is how much of the think-end the latest tokens spell (SGLang's TokenSequenceMatcher, a KMP
    step); ``history`` keeps it per thinking token so a rollback can undo each one.
    """

    end_ids: tuple[int, ...]
    in_think: int = 0  # thinking tokens that are not part of a pending think-end match
    after_end: int = -1  # -1 while thinking; then the answer tokens given to the grammar
    matched: int = 0
    history: list[int] = field(default_factory=list)

    @property
    def thinking(self) -> bool:
        return self.after_end == -1

    def advance(self, token: int) -> None:
        """One emitted token (SGLang's transfer_state)."""
        if not self.thinking:
            self.after_end += 1
            return
        before = self.matched
        self.history.append(before)
        matched = before
        while matched > 0 and token != self.end_ids[matched]:
            matched = self._fallback(matched)
        matched += token == self.end_ids[matched]
        if matched == len(self.end_ids):
            self.matched, self.after_end = 0, 0
        else:
            self.in_think += before + 1 - matched
            self.matched = matched

    def back(self) -> None:
        """Undo the latest token (SGLang's rollback_state); undoing the think-end's last re-opens thinking."""
        if self.after_end > 0:
            self.after_end -= 1
        elif self.history:
            before = self.history.pop()
            if self.after_end == 0:
                self.after_end = -1
            else:
                self.in_think -= before + 1 - self.matched
            self.matched = before

    def allowed(self) -> np.ndarray:
        """The thinking mask: anything but EOS while the budget lasts, then only the next think-end token."""
        if self.in_think + self.matched < THINK_TOKENS:
            row = np.ones(VOCAB_SIZE, dtype=bool)
            row[list(EOS_IDS)] = False
            return row
        row = np.zeros(VOCAB_SIZE, dtype=bool)
        row[self.end_ids[self.matched]] = True
        return row

    def _fallback(self, matched: int) -> int:
        """The longest proper prefix of the think-end that is also a suffix of its first `matched` ids."""
        for k in range(matched - 1, 0, -1):
            if self.end_ids[:k] == self.end_ids[matched - k : matched]:
                return k
        return 0


@dataclass
class Constraint:
    """One request's grammar matcher, and the token it refused (the request then ends with an abort)."""

    key: tuple[str, str]
    matcher: Any
    refused: int | None = None
    taken: int = 0  # tokens accepted through accept(): the refused token's index in the output
    think: ThinkPhase | None = None  # the request reasons first: no grammar until the think-end
    _bitmask: Any = field(default=None, repr=False)

    def allowed(self) -> np.ndarray:
        """Which tokens the grammar allows next, as a bool row over the vocabulary."""
        import xgrammar

        if self.think is not None and self.think.thinking:
            return self.think.allowed()
        if self._bitmask is None:
            self._bitmask = xgrammar.allocate_token_bitmask(1, VOCAB_SIZE)
        self.matcher.fill_next_token_bitmask(self._bitmask)
        words = self._bitmask.numpy().astype("<i4").view(np.uint8)
        bits: np.ndarray = np.unpackbits(words, bitorder="little")[:VOCAB_SIZE].astype(bool)
        return bits

    def accept(self, token: int) -> bool:
        """Advance by one emitted token; False (and remembered) when the grammar refuses it."""
        if self.refused is not None:
            return False
        if not self._take(token):
            self.refused = token
            return False
        self.taken += 1
        return True

    def _take(self, token: int) -> bool:
        """A token through the think phase into the matcher (SGLang: ReasonerGrammarObject.accept_token)."""
        if self.think is None:
            return bool(self.matcher.accept_token(token))
        if not self.think.thinking and not self.matcher.accept_token(token):
            return False
        self.think.advance(token)
        return True

    def _untake(self) -> None:
        """Roll the latest token back: out of the matcher only if it was an answer token."""
        if self.think is None or self.think.after_end > 0:
            self.matcher.rollback(1)
        if self.think is not None:
            self.think.back()

    def _terminated(self) -> bool:
        if self.think is not None and self.think.thinking:
            return False
        return bool(self.matcher.is_terminated())

    def refusal(self, output_len: int) -> dict[str, Any] | None:
        """The abort finish once the output reaches the refused token (SGLang aborts the request there)."""
        if self.refused is None or output_len <= self.taken:
            return None
        message = f"Grammar accept_token failed with token {self.refused} (grammar {self.key[0]})"
        return {"type": "abort", "message": message, "status_code": 500, "err_type": None}

    def draft_masks(self, tokens: list[int], parents: list[int]) -> list[np.ndarray]:
        """One mask per verified row: row 0 (after the last committed token), row i after draft node i.

        Walks the draft tree depth-first with the matcher and rolls every draft token back, so the matcher
        ends where it began. A node the grammar refuses gets an all-False mask: the target's masked choice
        at its parent can never be its token, so the verify never reaches it.
        """
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(parents):
            children.setdefault(parent, []).append(i + 1)
        masks: list[np.ndarray] = [np.zeros(VOCAB_SIZE, dtype=bool) for _ in range(len(tokens) + 1)]

        def visit(node: int) -> None:
            masks[node] = self.allowed()
            if self._terminated():
                return
            for child in children.get(node, []):
                if self._take(tokens[child - 1]):
                    visit(child)
                    self._untake()

        visit(0)
        return masks

    def commit(self, emitted: list[int], rejected: int | None, *, rollback_bug: bool) -> None:
        """Take a verify step's emitted tokens: the accepted drafts, then the target's own token.

        With the rollback bug the draft token rejected at the departure node stays in the matcher (when
        the grammar took it during the walk), between the accepted drafts and the target's token.
        """
        for token in emitted[:-1]:
            if not self.accept(token):
                return
        if rollback_bug and rejected is not None and not self._terminated():
            self._take(rejected)  # never rolled back
        self.accept(emitted[-1])


def masked(row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """The target's row with the grammar's disallowed tokens at -inf (SGLang's apply_vocab_mask)."""
    out: np.ndarray = np.where(allowed, row, -np.inf)
    return out
