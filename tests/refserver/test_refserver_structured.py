"""Constrained decoding: xgrammar masks in NONE and in every verify, SGLang's answers to bad grammars, and
the grammar that waits for the end of the reasoning."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import jsonschema
import pytest
from refserver_helpers import Job, post, run_jobs

from pytest_dflash.refserver.chat_surface import split_reasoning
from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.refserver.model import EOS_IDS, ByteTokenizer, TinyLM
from pytest_dflash.refserver.spec import Engine, SamplingParams
from pytest_dflash.refserver.structured import (
    NO_BACKEND,
    THINK_TOKENS,
    Constraint,
    GrammarBackend,
    response_format_schema,
)

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
    # SGLang 0.5.17's words, xgrammar's reason after the clock (tests/data/sglang-0.5.17-h100-structured)
    message = answer.json()["error"]["message"]
    assert re.fullmatch(r"Failed to compile json grammar: \[\d\d:\d\d:\d\d\] /project/cpp/json_schema_converter"
                        r"\.cc:\d+: Type should be a string\n", message), message


def test_grammar_backend_none_refuses_constrained_requests() -> None:
    """SGLang's GrammarManager text: a client of such a server learns it only from this 400."""
    with RefServerProcess("--grammar-backend", "none") as server:
        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 8, "regex": REGEX}}
        answer = post(server, "/generate", body)
        assert answer.status_code == 400
        assert answer.json()["error"]["message"] == NO_BACKEND


# --- reasoning first, then the constrained answer (SGLang's ReasonerGrammarBackend) ----------------------

THINK_END = tuple(b"</think>")


def reasoner(key: tuple[str, str] = ("json", json.dumps(SCHEMA))) -> Constraint:
    return GrammarBackend(any_whitespace=False, think_end_ids=THINK_END).constraint(key, reasoning=True)


def test_the_grammar_waits_for_the_think_end_and_the_verify_walk_crosses_it() -> None:
    """No mask while thinking; the draft rows after a think-end inside the block get the grammar's mask; the
    walk leaves the matcher and the think phase where they were."""
    constraint = reasoner()
    for token in tok.encode("ab</thi"):
        assert constraint.accept(token)
    assert constraint.allowed()[ord("x")]  # still thinking: free text (the budget is not spent)
    draft = tok.encode("nk>{")
    masks = constraint.draft_masks(draft, list(range(len(draft))))
    assert masks[2][ord("x")] and not masks[3][ord("x")] and masks[3][ord("{")]  # the answer starts after '>'
    assert not masks[4][ord("{")] and masks[4][ord('"')]
    assert constraint.think is not None and constraint.think.thinking and constraint.think.matched == 5
    assert (constraint.allowed() == masks[0]).all()
    constraint.commit([*draft[:3], ord("{")], None, rollback_bug=False)
    assert not constraint.think.thinking and constraint.allowed()[ord('"')]


def test_a_spent_thinking_budget_forces_the_think_end_and_eos_never_ends_thinking() -> None:
    constraint = reasoner(("regex", "[0-9]{2}"))
    assert not constraint.allowed()[EOS_IDS[0]]
    for _ in range(THINK_TOKENS):
        assert constraint.accept(ord("x"))
    for token in THINK_END:
        assert constraint.allowed().nonzero()[0].tolist() == [token]
        assert constraint.accept(token)
    assert constraint.allowed()[ord("7")] and not constraint.allowed()[ord("x")]


def reasoning_jobs(greedy: bool) -> list[Job]:
    params = SamplingParams(max_new_tokens=160, top_k=1 if greedy else -1, grammar=("json", json.dumps(SCHEMA)),
                            reasoning=True)  # fmt: skip
    return [Job(tok.encode(prompt), params, seed=i) for i, prompt in enumerate(PROMPTS)]


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_reasoning_then_a_valid_answer_on_every_algorithm(model: TinyLM, greedy: bool) -> None:
    """Reasoning runs free up to </think>, the answer after it validates; the same tokens on NONE, DFLASH and
    DDTREE (masks only after the think-end in every verify)."""
    outputs = {}
    for algorithm in ("NONE", "DFLASH", "DDTREE"):
        grammar = GrammarBackend(any_whitespace=False, think_end_ids=THINK_END)
        outputs[algorithm] = [o.output_ids for o in run_jobs(Engine(model, algorithm, grammar=grammar),
                                                             reasoning_jobs(greedy))]  # fmt: skip
    assert outputs["DFLASH"] == outputs["NONE"] == outputs["DDTREE"]
    for ids in outputs["NONE"]:
        reasoning, content = split_reasoning(tok.decode(ids), "deepseek-r1", force=True)
        assert reasoning and not reasoning.startswith("{")
        jsonschema.validate(json.loads(content, strict=False), SCHEMA)


@pytest.fixture(scope="module")
def reasoning_server() -> Iterator[RefServerProcess]:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--reasoning-parser", "deepseek-r1",
                          "--tool-call-parser", "qwen25", "--constrained-json-disable-any-whitespace") as s:  # fmt: skip
        yield s


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 160, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}  # fmt: skip


def test_chat_reasons_then_answers_in_the_schema_streamed_and_not(reasoning_server: RefServerProcess) -> None:
    """SGLang's shape: reasoning_content free text, content the schema's JSON; a stream splits them the same."""
    message = post(reasoning_server, "/v1/chat/completions", CHAT).json()["choices"][0]["message"]
    assert message["reasoning_content"] and "</think>" not in message["reasoning_content"]
    jsonschema.validate(json.loads(message["content"], strict=False), SCHEMA)
    parts = {"reasoning_content": "", "content": ""}
    with httpx.stream("POST", reasoning_server.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                      timeout=60) as response:  # fmt: skip
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    for part in parts:
                        parts[part] += choice["delta"].get(part) or ""
    assert parts == {"reasoning_content": message["reasoning_content"], "content": message["content"]}
    whole = post(reasoning_server, "/v1/chat/completions", {**CHAT, "separate_reasoning": False}).json()
    assert whole["choices"][0]["message"]["content"] == f"{message['reasoning_content']}</think>{message['content']}"


def test_a_forced_tool_call_reasons_first_then_calls(reasoning_server: RefServerProcess) -> None:
    """tool_choice "required" is a grammar too: it holds after </think>, the call parses from the content;
    streamed, the reasoning deltas come first, then the call's."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": SCHEMA}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 160, "temperature": 0,
            "tools": tools, "tool_choice": "required"}  # fmt: skip
    choice = post(reasoning_server, "/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"]
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "add"
    jsonschema.validate(json.loads(call["arguments"], strict=False), SCHEMA)
    reasoning, arguments, reasons = "", "", []
    with httpx.stream("POST", reasoning_server.url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=60) as response:  # fmt: skip
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for streamed in json.loads(line[6:])["choices"]:
                    assert not (arguments and streamed["delta"].get("reasoning_content")), "reasoning after the call"
                    reasoning += streamed["delta"].get("reasoning_content") or ""
                    for delta in streamed["delta"].get("tool_calls") or []:
                        arguments += delta["function"]["arguments"]
                    reasons.append(streamed["finish_reason"])
    assert (reasoning, arguments) == (choice["message"]["reasoning_content"], call["arguments"])
    assert reasons[-1] == "tool_calls" and not any(reasons[:-1])


def test_generate_does_not_reason_under_the_parser(reasoning_server: RefServerProcess) -> None:
    """Native /generate has no require_reasoning: its grammar holds from the first token."""
    body = {"text": "Hi", "sampling_params": {"temperature": 0, "max_new_tokens": 80, "regex": REGEX}}
    assert re.fullmatch(REGEX, post(reasoning_server, "/generate", body).json()["text"])


def test_reasoning_grammar_bug_puts_the_answer_into_reasoning_content() -> None:
    """The fault leaves SGLang's reasoner wrapper out: the grammar holds from the first token, no </think>."""
    with RefServerProcess("--reasoning-parser", "deepseek-r1", "--constrained-json-disable-any-whitespace",
                          "--inject", "reasoning-grammar-bug") as server:  # fmt: skip
        message = post(server, "/v1/chat/completions", CHAT).json()["choices"][0]["message"]
    assert message["content"] == ""
    jsonschema.validate(json.loads(message["reasoning_content"], strict=False), SCHEMA)


def test_a_forced_call_cut_by_max_tokens_answers_as_sglang_did() -> None:
    """Real SGLang 0.5.17 (qwen25, recorded: tests/data/sglang-0.5.17-h100-2026-12-06/toolcall-answers.txt)
    reports a forced call cut by max_tokens as the call it parsed, arguments "null", content "", finish
    "length"; the refserver answers the same shape. Under --grammar-backend none a streamed constrained chat
    is HTTP 200, an error event with code 400, the usage chunk, [DONE] (serving_chat)."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": SCHEMA}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "temperature": 0,
            "tools": tools, "tool_choice": "required"}  # fmt: skip
    # no free whitespace: '[{"name":"add"' comes within 20 tokens (SGLang's structural tag writes the name itself)
    with RefServerProcess("--tool-call-parser", "qwen25", "--constrained-json-disable-any-whitespace") as server:
        choice = post(server, "/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == ""
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        ("add", "null")]
    with RefServerProcess("--grammar-backend", "none") as server:
        got = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True, "response_format": {"type": "json_object"},
            "stream_options": {"include_usage": True}})
    assert got.status_code == 200
    events = [line[6:] for line in got.text.splitlines() if line.startswith("data: ")]
    error = json.loads(events[0])["error"]
    assert (error["code"], error["type"]) == (400, "BAD_REQUEST") and "--grammar-backend none" in error["message"]
    assert json.loads(events[1])["usage"]["completion_tokens"] == 0 and events[2:] == ["[DONE]"]
