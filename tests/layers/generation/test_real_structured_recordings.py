"""Real SGLang 0.5.17 answers to constrained requests (issue 33 item 6; tests/data/sglang-0.5.17-h100-structured,
README there), read by the package's own code: the client parses the recorded bytes, the generation layer's
validation judges them, grammar parity compares the speculative services' greedy ids with plain's. And the
refserver, asked the same requests, answers as SGLang did where the model does not decide the answer (error
bodies, the refusal of a server without a grammar backend, whole and streamed)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_dflash.client.answers import streamed_answer, whole_answer
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.generation.chat_surface import check_tool_calls
from pytest_dflash.layers.generation.requests import Api
from pytest_dflash.layers.generation.structured import (
    GRAMMARS,
    NO_BACKEND_FLAG,
    check_outcome,
    send,
    unserved_problem,
)
from pytest_dflash.layers.parity.greedy import first_divergence
from pytest_dflash.layers.parity.structured import constrained_greedy
from pytest_dflash.refserver.launch import RefServerProcess

DATA = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h100-structured"
SPECULATIVE = ("dflash", "ngram")
SERVING = ("plain", *SPECULATIVE)
# recorded case -> (api, the package's grammar with the same constraint)
CONSTRAINED: dict[str, tuple[Api, str]] = {
    **{f"generate-{g}-{mode}{stream}": ("generate", g) for g in ("json_schema", "regex", "ebnf")
       for mode in ("greedy", "sampled") for stream in ("", "-stream")},
    "chat-json_schema": ("chat", "response_format"),
    "chat-json_object": ("chat", "json_object"),
}  # fmt: skip
MAX_TOKENS = 160  # the recorder's max_new_tokens / max_tokens


def recording(service: str) -> dict[str, dict[str, Any]]:
    data = json.loads((DATA / f"{service}.json").read_text())
    return {answer["case"]: answer for answer in data["answers"]}


def replaying(answer: dict[str, Any]) -> InferenceClient:
    """A client whose POSTs get the recorded status and bytes (SSE where the recording streamed)."""
    raw: str = answer["answer"]
    streamed = raw.startswith("data:")

    def respond(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # /v1/models: the chat body names the model
            return httpx.Response(200, json={"object": "list", "data": [{"id": "default", "object": "model"}]})
        kind = "text/event-stream" if streamed else "application/json"
        return httpx.Response(answer["status"], content=raw.encode(), headers={"content-type": kind})

    client = InferenceClient("http://replay.invalid", service="recorded")
    client._http = httpx.Client(base_url="http://replay.invalid", transport=httpx.MockTransport(respond))
    return client


def sampling_of(case: str) -> Sampling:
    return Sampling(max_tokens=MAX_TOKENS, temperature=0.8 if "sampled" in case else 0.0, seed=11)


@pytest.mark.parametrize("case", sorted(CONSTRAINED))
@pytest.mark.parametrize("service", SERVING)
def test_every_constrained_answer_is_in_its_grammar(service: str, case: str) -> None:
    """The constraint, not the model, makes a random model's output valid: every answer of plain, DFLASH and
    NGRAM (whose drafts were accepted, so the verify ran with the mask) passes the generation layer's
    check, whole and streamed."""
    answer = recording(service)[case]
    assert answer["status"] == 200
    api, grammar = CONSTRAINED[case]
    outcome = send(replaying(answer), api, GRAMMARS[grammar], sampling_of(case), stream="stream" in case)
    check_outcome(outcome, GRAMMARS[grammar], what=f"{service} {case}", max_tokens=MAX_TOKENS)
    # free whitespace (SGLang's default) on a random model: JSON fills max_new_tokens with it, a length finish
    # judged as a prefix by the matcher; regex and EBNF end by their grammar
    if grammar in ("json_schema", "response_format"):
        assert outcome.finish_reason == "length" and GRAMMARS[grammar].prefix_problem(outcome.content) is None
    if grammar in ("regex", "ebnf"):
        assert outcome.finish_reason == "stop" and GRAMMARS[grammar].problem(outcome.content) is None


def test_the_check_would_catch_a_broken_answer() -> None:
    """The same recorded bytes with the output moved outside the grammar fail: the test above can fail."""
    answer = dict(recording("dflash")["generate-regex-greedy"])
    answer["answer"] = answer["answer"].replace('"text":"quf-99"', '"text":"quf-999"')
    outcome = send(replaying(answer), "generate", GRAMMARS["regex"], sampling_of("greedy"), stream=False)
    with pytest.raises(AssertionError, match="does not fully match"):
        check_outcome(outcome, GRAMMARS["regex"], what="dflash", max_tokens=MAX_TOKENS)


@pytest.mark.parametrize("case", ["chat-tool-required", "chat-tool-named"])
@pytest.mark.parametrize("service", SERVING)
def test_a_forced_call_cut_by_max_tokens_fails_naming_the_limit(service: str, case: str) -> None:
    """qwen25 forces the call through its grammar: the call names `add`, the random model then fills
    whitespace until max_tokens, and SGLang reports what it parsed (arguments "null") with finish_reason
    length. That is a call cut by max_tokens, and the check says exactly that (not "no output at all")."""
    answer = recording(service)[case]
    parsed = whole_answer(json.loads(answer["answer"]), "chat", service)
    assert parsed.finish_reason == "length" and [c.name for c in parsed.tool_calls] == ["add"]
    with pytest.raises(AssertionError, match=re.escape(f"the forced call was cut by max_tokens={MAX_TOKENS} "
                                                       "(finish_reason 'length'): add('null')")):
        check_tool_calls(parsed, "add" if case.endswith("named") else None, what=f"{service} {case}",
                         max_tokens=MAX_TOKENS)


TOOLCALLS = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h100-2026-12-06" / "toolcall-answers.txt"


def toolcall_answers() -> dict[str, str]:
    """The recorded answers by their '== ' heading (whole: a JSON body; streamed: the SSE text)."""
    sections: dict[str, list[str]] = {}
    heading = ""
    for line in TOOLCALLS.read_text().splitlines():
        if line.startswith("== "):
            heading = line[3:]
            sections[heading] = []
        elif heading:
            sections[heading].append(line)
    return {k: "\n".join(v).strip() for k, v in sections.items()}


@pytest.mark.parametrize(("heading", "message"), [
    ('whole, tool_choice "required", max_tokens 200', "the forced call was cut by max_tokens=200 (finish_reason "
                                                      "'length'): add('null')"),
    ('whole, tool_choice "required", max_tokens 2000', "the forced call was cut by max_tokens=2000"),
    ('streamed, tool_choice "required", max_tokens 200', "the forced call was cut by max_tokens=200 (finish_reason "
                                                         "'length'): add('')"),
    ('whole, tool_choice {"type":"function","function":{"name":"add"}}, max_tokens 200',
     "the answer counts 1410 completion tokens for max_tokens=200 (finish_reason 'tool_calls', add('null'))"),
])
def test_real_forced_calls_of_a_random_model_fail_saying_why(heading: str, message: str) -> None:
    """Real SGLang 0.5.17 (--tool-call-parser qwen25, H100, 2026-12-06): whole, a call named `add` with arguments
    "null" and finish length; streamed, the name then nothing; named, finish tool_calls after 1410 tokens for
    max_tokens 200. Each is failed, the call and the limit named: none is "no output at all"."""
    raw = toolcall_answers()[heading]
    limit = int(heading.rsplit(" ", 1)[1])
    if raw.startswith("data:"):
        events = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data: {")]
        parsed = streamed_answer(events, "chat", done=raw.rstrip().endswith("[DONE]"))
    else:
        parsed = whole_answer(json.loads(raw), "chat", "plain")
    assert [c.name for c in parsed.tool_calls] == ["add"]
    with pytest.raises(AssertionError, match=re.escape(message)) as failed:
        check_tool_calls(parsed, None, what="plain", max_tokens=limit)
    assert "no output at all" not in str(failed.value)


def test_a_whole_forced_call_the_server_withheld_is_named_as_cut() -> None:
    """Real SGLang 0.5.17 (H100, 2026-12-06, second run, the same random model): streamed, the call came as
    add('7802020202…') cut at max_tokens 200; whole, the answer held no tool call and no content, finish length,
    200 completion tokens. The check names the cut call the parser withheld, not "no output at all"."""
    data = {"id": "x", "object": "chat.completion", "model": "default", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None},
         "logprobs": None, "finish_reason": "length", "matched_stop": None}],
        "usage": {"prompt_tokens": 24, "total_tokens": 224, "completion_tokens": 200}}
    parsed = whole_answer(data, "chat", "plain")
    with pytest.raises(AssertionError, match=re.escape(
            "the forced call was cut by max_tokens=200 (finish_reason 'length', 200 completion tokens) and the "
            "answer carries neither a tool call nor content")) as failed:
        check_tool_calls(parsed, None, what="plain", max_tokens=200)
    assert "no output at all" not in str(failed.value)
    data["usage"]["completion_tokens"] = 3  # a length finish after 3 of 200 tokens is the server's lie
    with pytest.raises(AssertionError, match="after 3 of max_tokens=200 tokens"):
        check_tool_calls(whole_answer(data, "chat", "plain"), None, what="plain", max_tokens=200)


@pytest.mark.parametrize("case", sorted(CONSTRAINED))
def test_a_server_without_a_grammar_backend_says_so_and_the_layer_names_the_flag(case: str) -> None:
    """`--grammar-backend none` (seed 002's fix): a 400 naming the flag, or for a streamed /generate HTTP 200
    with one token and an abort naming it. The generation layer fails a service that should serve grammars
    with that text; one whose profile says structured_output = false passes it as a refusal."""
    answer = recording("nogrammar")[case]
    api, grammar = CONSTRAINED[case]
    client = replaying(answer)
    if "stream" not in case:
        assert answer["status"] == 400
        with pytest.raises(ApiError) as refused:
            send(client, api, GRAMMARS[grammar], sampling_of(case), stream=False)
        assert refused.value.status == 400 and NO_BACKEND_FLAG in str(refused.value)
        return
    assert answer["status"] == 200
    outcome = send(client, api, GRAMMARS[grammar], sampling_of(case), stream=True)
    assert outcome.finish_reason == "abort" and NO_BACKEND_FLAG in (outcome.finish_message or "")
    assert unserved_problem(outcome, GRAMMARS[grammar], MAX_TOKENS) is None  # structured_output = false: refused, passes
    with pytest.raises(AssertionError, match="finish_reason 'abort'.*--grammar-backend none"):
        check_outcome(outcome, GRAMMARS[grammar], what="nogrammar", max_tokens=MAX_TOKENS)


@pytest.mark.parametrize("service", SPECULATIVE)
@pytest.mark.parametrize("grammar", ["json_schema", "regex", "ebnf"])
def test_greedy_constrained_ids_under_speculation_are_plain_s(service: str, grammar: str) -> None:
    """Grammar parity on the real thing: DFLASH's and NGRAM's greedy constrained /generate ids are plain's."""
    case = f"generate-{grammar}-greedy"
    runs = [constrained_greedy(replaying(recording(name)[case]), "The quick brown fox", GRAMMARS[grammar])
            for name in ("plain", service)]
    assert runs[0].ids and first_divergence(runs[0].ids, runs[1].ids) is None


def test_the_refserver_answers_these_requests_as_sglang_did() -> None:
    """Where the model does not decide the answer, the CPU double's bytes follow the recording: the error
    body of a schema and a regex that do not compile (xgrammar's own reason), and a server without a grammar
    backend — 400 whole, an in-band abort after one token streamed, SGLang's message word for word."""
    plain, nogrammar = recording("plain"), recording("nogrammar")
    clock = re.compile(r"\[\d\d:\d\d:\d\d\]")
    with RefServerProcess() as server:
        for case in ("generate-bad-schema", "generate-bad-regex"):
            got = httpx.post(f"{server.url}/generate", json=plain[case]["body"], timeout=30)
            assert got.status_code == plain[case]["status"] == 400
            assert clock.sub("[T]", got.text) == clock.sub("[T]", plain[case]["answer"])
    with RefServerProcess("--grammar-backend", "none") as server:
        for case, answer in nogrammar.items():
            got = httpx.post(f"{server.url}{answer['path']}", json=answer["body"], timeout=30)
            assert got.status_code == answer["status"], case
            if answer["status"] == 400:
                assert json.loads(got.text) == json.loads(answer["answer"]) or (
                    json.loads(got.text)["message"] == json.loads(answer["answer"])["message"]), case
                continue
            events = [json.loads(line[6:]) for line in got.text.splitlines()
                      if line.startswith("data: {")]  # fmt: skip
            recorded = [json.loads(line[6:]) for line in answer["answer"].splitlines()
                        if line.startswith("data: {")]  # fmt: skip
            assert len(events) == len(recorded) == 1 and got.text.rstrip().endswith("data: [DONE]"), case
            finish, expected = events[0]["meta_info"]["finish_reason"], recorded[0]["meta_info"]["finish_reason"]
            assert finish == expected, case
            assert events[0]["meta_info"]["completion_tokens"] == recorded[0]["meta_info"]["completion_tokens"]
