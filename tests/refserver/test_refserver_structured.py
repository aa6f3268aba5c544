"""Constrained decoding: xgrammar masks in NONE and in every verify, SGLang's answers to bad grammars."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import jsonschema
import pytest
from refserver_helpers import Job, post, run_jobs

from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.refserver.model import ByteTokenizer, TinyLM
from pytest_dflash.refserver.spec import Engine, SamplingParams
from pytest_dflash.refserver.structured import NO_BACKEND, GrammarBackend, response_format_schema

pytest.importorskip("xgrammar")

tok = ByteTokenizer()
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "maximum": 999}},
    "required": ["name", "age"],
}
REGEX = r"[a-z]{3}-\d{2}"
EBNF = 'root ::= "yes" | "no" | "maybe"'
PROMPTS = ("Hello world!", "The quick brown fox", "def fibonacci(n):")
ALGORITHMS = (("NONE", {}), ("DFLASH", {}), ("DDTREE", {}), ("EAGLE", {"num_steps": 3, "topk": 4}))


def constrained(grammar: tuple[str, str], *, greedy: bool, max_new_tokens: int = 96) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, top_k=1 if greedy else -1, grammar=grammar)


def engine(model: TinyLM, algorithm: str, *, bug: bool = False, **kw: int) -> Engine:
    grammar = GrammarBackend(any_whitespace=False)
    return Engine(model, algorithm, grammar=grammar, grammar_rollback_bug=bug, **kw)  # type: ignore[arg-type]


def jobs(greedy: bool) -> list[Job]:
    out = []
    for i, prompt in enumerate(PROMPTS):
        for grammar in (("json", json.dumps(SCHEMA)), ("regex", REGEX), ("ebnf", EBNF)):
            out.append(Job(tok.encode(prompt), constrained(grammar, greedy=greedy), seed=i))
    return out


def texts(model: TinyLM, algorithm: str, greedy: bool, **kw: int) -> list[str]:
    outputs = run_jobs(engine(model, algorithm, **kw), jobs(greedy))
    assert all(o.finish is not None and o.finish["type"] == "stop" for o in outputs), [o.finish for o in outputs]
    return [tok.decode(o.output_ids) for o in outputs]


def assert_valid(outputs: list[str]) -> None:
    for i, text in enumerate(outputs):
        kind = i % 3
        if kind == 0:
            jsonschema.validate(json.loads(text, strict=False), SCHEMA)  # xgrammar lets raw control characters into strings
        elif kind == 1:
            assert re.fullmatch(REGEX, text), text
        else:
            assert text in ("yes", "no", "maybe"), text


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_every_algorithm_emits_the_same_valid_output(model: TinyLM, greedy: bool) -> None:
    """Masks applied in NONE's step and in every verify: valid output, the same tokens on every algorithm
    (same seed), so constrained decoding is lossless under speculation."""
    plain = texts(model, "NONE", greedy)
    assert_valid(plain)
    for algorithm, kw in ALGORITHMS[1:]:
        assert texts(model, algorithm, greedy, **kw) == plain, algorithm


def test_rollback_bug_breaks_speculation_only(model: TinyLM) -> None:
    """grammar-rollback-bug: NONE unaffected; DFLASH's output aborts or leaves the grammar."""
    plain = run_jobs(engine(model, "NONE", bug=True), jobs(True))
    assert_valid([tok.decode(o.output_ids) for o in plain])
    spec = run_jobs(engine(model, "DFLASH", bug=True), jobs(True))
    broken = [o for o, p in zip(spec, plain, strict=True) if o.output_ids != p.output_ids]
    assert broken, "the rollback bug changed nothing under DFLASH"
    assert any(o.finish is not None and o.finish["type"] == "abort" for o in broken)


def test_response_format_maps_as_sglang_chat_does() -> None:
    assert response_format_schema({"type": "json_object"}) == '{"type": "object"}'
    assert response_format_schema({"type": "text"}) is None
    spec = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    assert json.loads(response_format_schema(spec) or "") == SCHEMA


# --- over HTTP -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dflash_json() -> Iterator[RefServerProcess]:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--constrained-json-disable-any-whitespace") as s:
        yield s


def test_generate_and_chat_serve_constrained_output(dflash_json: RefServerProcess) -> None:
    """/generate json_schema / regex / ebnf and chat response_format answer valid output."""
    body = {"text": "Hi", "sampling_params": {"temperature": 0, "max_new_tokens": 80, "regex": REGEX}}
    answer = post(dflash_json, "/generate", body).json()
    assert re.fullmatch(REGEX, answer["text"]) and answer["meta_info"]["finish_reason"]["type"] == "stop"
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 80, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}  # fmt: skip
    choice = post(dflash_json, "/v1/chat/completions", chat).json()["choices"][0]
    jsonschema.validate(json.loads(choice["message"]["content"], strict=False), SCHEMA)
    assert choice["finish_reason"] == "stop"


def test_a_bad_grammar_is_sglangs_400(dflash_json: RefServerProcess) -> None:
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 8, "json_schema": '{"type": 12}'}}
    answer = post(dflash_json, "/generate", body)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        "Invalid grammar request: req.grammar_key=('json', '{\"type\": 12}')"
    )


def test_grammar_backend_none_refuses_constrained_requests() -> None:
    """SGLang's GrammarManager text: a client of such a server learns it only from this 400."""
    with RefServerProcess("--grammar-backend", "none") as server:
        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 8, "regex": REGEX}}
        answer = post(server, "/generate", body)
        assert answer.status_code == 400
        assert answer.json()["error"]["message"] == NO_BACKEND
