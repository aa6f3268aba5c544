"""The HTTP API of real refserver processes, checked against responses recorded from SGLang 0.5.17."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from typing import Any

import httpx
import pytest
from refserver_helpers import TIMEOUT, assert_same_shape, get, post

from pytest_dflash.refserver.launch import RefServerProcess


def sse_events(response_text: str) -> list[str]:
    """The payloads of 'data: ...' lines; every event must be followed by a blank line."""
    lines = response_text.split("\n")
    assert lines[-2:] == ["", ""] or lines[-1] == "", "a stream ends with a blank line"
    events = []
    for i, line in enumerate(lines):
        if line.startswith("data: "):
            assert lines[i + 1] == "", "SSE events are separated by blank lines"
            events.append(line[len("data: ") :])
    return events


def stream(server: RefServerProcess, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    r = post(server, path, body)
    return r, sse_events(r.text)


# --- native API on a DFLASH server ------------------------------------------------------------------


def test_generate_has_the_recorded_shape(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["dflash/generate_greedy_1"]
    r = post(dflash_server, "/generate", real["request"])
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json" and r.headers["server"] == "uvicorn"
    body = r.json()
    assert list(body) == ["text", "output_ids", "meta_info"]
    assert list(body["meta_info"]) == list(real["body_json"]["meta_info"])  # same fields, same order
    assert_same_shape(body, real["body_json"])
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 32} and meta["completion_tokens"] == 32
    assert meta["spec_accept_length"] == pytest.approx(32 / meta["spec_verify_ct"])
    assert sum(meta["spec_accept_histogram"]) == meta["spec_verify_ct"]
    assert meta["spec_num_proposed_drafts"] == 7 * meta["spec_verify_ct"]  # block size 8
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"])


def test_batch_generate_returns_a_list(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["dflash/generate_batch2"]
    body = post(dflash_server, "/generate", real["request"]).json()
    assert isinstance(body, list) and len(body) == 2
    assert_same_shape(body[0], real["body_json"][0])


def test_return_logprob_is_refused_by_dflash(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["dflash/generate_logprob"]
    r = post(dflash_server, "/generate", real["request"])
    assert (r.status_code, r.json()) == (real["status"], real["body_json"])


def test_generate_stream_repeats_cumulative_output(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["dflash/generate_stream"]
    r, events = stream(dflash_server, "/generate", real["request"])
    assert r.headers["content-type"] == real["headers"]["content-type"] == "text/event-stream; charset=utf-8"
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    real_chunks = [json.loads(line[6:]) for line in real["sse_lines"] if line.startswith("data: {")]
    assert_same_shape(chunks[-1], real_chunks[-1])
    assert list(chunks[0]["meta_info"]) == list(real_chunks[0]["meta_info"])  # the first event
    assert list(chunks[1]["meta_info"]) == list(real_chunks[1]["meta_info"])  # later ones
    for a, b in itertools.pairwise(chunks):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
    whole = post(dflash_server, "/generate", {**real["request"], "stream": False}).json()
    assert chunks[-1]["output_ids"] == whole["output_ids"] and chunks[-1]["text"] == whole["text"]


def test_errors_have_sglang_shapes(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["dflash/err_bad_temperature"]
    r = post(dflash_server, "/generate", real["request"])
    assert (r.status_code, r.json()) == (400, real["body_json"])
    long_prompt = "The quick brown fox" * 120  # 2280 tokens > 2048
    r = post(dflash_server, "/generate", {"text": long_prompt, "sampling_params": {"max_new_tokens": 8}})
    message = "The input (2280 tokens) is longer than the model's context length (2048 tokens)."
    assert (r.status_code, r.json()) == (400, {"error": {"message": message}})
    assert re.fullmatch(r"The input \(\d+ tokens\) is longer .*\(\d+ tokens\)\.", recorded["dflash/err_too_long"]
                        ["body_json"]["error"]["message"])  # fmt: skip
    r = post(dflash_server, "/generate", {"text": "x" * 2000, "sampling_params": {"max_new_tokens": 100}})
    assert r.json()["error"]["message"].startswith(
        "Requested token count exceeds the model's maximum context length of 2048 tokens. You requested a total of "
        "2100 tokens: 2000 tokens from the input messages and 100 tokens for the completion."
    )
    r = post(dflash_server, "/generate", {"text": "x" * 2000, "sampling_params": {"temperature": 0}})  # default 128
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 48  # stops at the context length
    real = recorded["dflash/err_chat_no_messages"]
    r = post(dflash_server, "/v1/chat/completions", real["request"])
    assert r.status_code == 400
    assert list(r.json()) == list(real["body_json"])
    assert {k: v for k, v in r.json().items() if k != "message"} == {
        k: v for k, v in real["body_json"].items() if k != "message"
    }
    assert r.json()["message"].startswith("1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages')")
    r = get(dflash_server, "/no_such_endpoint")
    assert (r.status_code, r.json()) == (404, recorded["dflash/err_not_found"]["body_json"])
    r = post(dflash_server, "/v1/completions", {"prompt": "x", "temperature": -1})
    assert r.json()["message"] == "temperature must be a non-negative finite number, got -1."


def test_info_endpoints(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    models = get(dflash_server, "/v1/models").json()
    real = recorded["dflash/v1_models"]["body_json"]
    assert_same_shape(models, real)
    assert models["data"][0]["id"] == "refserver/tiny-target" and models["data"][0]["max_model_len"] == 2048
    info = get(dflash_server, "/model_info").json()
    assert list(info) == list(recorded["dflash/model_info"]["body_json"])[: len(info)]
    server_info = get(dflash_server, "/server_info").json()
    real_keys = recorded["dflash/server_info_after"]["top_level_keys"]
    assert list(server_info)[-7:] == real_keys[-7:]
    assert server_info["version"] == "0.5.17" and server_info["speculative_algorithm"] == "DFLASH"
    internal = server_info["internal_states"][0]
    assert list(internal)[-6:] == list(recorded["dflash/server_info_after"]["internal_state_tail"])
    assert get(dflash_server, "/get_server_info").json()["internal_states"][0].keys() == internal.keys()


def test_health_is_an_empty_200(dflash_server: RefServerProcess) -> None:
    for path in ("/health", "/health_generate"):
        r = get(dflash_server, path)
        assert (r.status_code, r.content, r.headers["content-length"]) == (200, b"", "0")


def test_avg_accept_length_is_cumulative_until_flush(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    post(dflash_server, "/generate", {"text": "Hello world!", "sampling_params": {"temperature": 0, "max_new_tokens": 64}})
    before = get(dflash_server, "/server_info").json()["internal_states"][0]["avg_spec_accept_length"]
    assert 2.0 <= before <= 8.0
    real = recorded["dflash/flush_cache"]
    r = post(dflash_server, "/flush_cache", {})
    assert (r.status_code, r.text) == (200, real["body_text"])
    assert "content-type" not in r.headers  # as recorded: a bare text body
    after = get(dflash_server, "/server_info").json()["internal_states"][0]["avg_spec_accept_length"]
    assert after == 0.0


def test_metrics_use_sglang_names(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    post(dflash_server, "/generate", {"text": "metrics", "sampling_params": {"max_new_tokens": 8}})
    r = get(dflash_server, "/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    types = set(re.findall(r"^# TYPE (\S+) (\S+)", r.text, re.M))
    real_types = {tuple(t) for t in recorded["dflash/metrics"]["metric_types"]}
    wanted = {"sglang:spec_verify_calls_total", "sglang:num_requests_total", "sglang:generation_tokens_total",
              "sglang:prompt_tokens_total", "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
              "sglang:num_running_reqs", "sglang:gen_throughput"}  # fmt: skip
    assert {t for t in types if t[0] in wanted} == {t for t in real_types if t[0] in wanted}
    verify = re.search(r'^sglang:spec_verify_calls_total\{engine_type="unified",model_name="[^"]+"\} (\S+)$', r.text, re.M)
    assert verify is not None and float(verify.group(1)) > 0
    requests = re.search(r'^sglang:num_requests_total\{[^}]*is_streaming="false"[^}]*\} (\S+)$', r.text, re.M)
    assert requests is not None and float(requests.group(1)) >= 1


def test_metrics_are_404_without_enable_metrics(ddtree_server: RefServerProcess) -> None:
    r = get(ddtree_server, "/metrics")
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})


# --- OpenAI API --------------------------------------------------------------------------------------


def test_chat_completion_has_the_recorded_shape(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["dflash/chat_completions"]
    body = post(dflash_server, "/v1/chat/completions", real["request"]).json()
    assert_same_shape(body, real["body_json"])
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 32


def test_chat_stream_has_the_recorded_shape(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["dflash/chat_completions_stream"]
    _, events = stream(dflash_server, "/v1/chat/completions", real["request"])
    real_events = [line[6:] for line in real["sse_lines"] if line.startswith("data: ")]
    assert events[-1] == real_events[-1] == "[DONE]"
    ours, theirs = [json.loads(e) for e in events[:-1]], [json.loads(e) for e in real_events[:-1]]
    for i in (0, 1, -2, -1):  # role chunk, content chunk, finish chunk, usage chunk
        assert_same_shape(ours[i], theirs[i], f"event {i}")
    assert ours[-1]["usage"]["completion_tokens"] == 12
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in ours[:-1])
    whole = post(dflash_server, "/v1/chat/completions", {**real["request"], "stream": False}).json()
    assert content == whole["choices"][0]["message"]["content"]


def test_completions_have_the_recorded_shapes(dflash_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["dflash/completions"]
    body = post(dflash_server, "/v1/completions", real["request"]).json()
    assert_same_shape(body, real["body_json"])
    real = recorded["dflash/completions_stream"]
    _, events = stream(dflash_server, "/v1/completions", real["request"])
    theirs = [json.loads(line[6:]) for line in real["sse_lines"] if line.startswith("data: {")]
    ours = [json.loads(e) for e in events[:-1]]
    for i in (0, -2, -1):
        assert_same_shape(ours[i], theirs[i], f"event {i}")
    assert ours[-2]["choices"][0]["finish_reason"] == "length"


def test_openai_n_stop_and_matched_stop(none_server: RefServerProcess) -> None:
    base = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
    text = post(none_server, "/v1/completions", base).json()["choices"][0]["text"]
    stop = text[6:8]
    body = post(none_server, "/v1/completions", {**base, "stop": [stop]}).json()
    choice = body["choices"][0]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", stop)
    assert choice["text"] == text[: text.find(stop)]
    body = post(none_server, "/v1/completions", {**base, "n": 3, "temperature": 1.0, "seed": 7}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] == len(b"Once upon a time")
    assert body["usage"]["completion_tokens"] == 3 * 24
    _, events = stream(none_server, "/v1/completions", {**base, "stop": stop, "stream": True})
    streamed = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert streamed == text[: text.find(stop)]  # no piece of the stop string leaks into the stream


# --- NONE: logprobs, concurrency, logs ---------------------------------------------------------------


def test_none_server_returns_logprobs(none_server: RefServerProcess, recorded: dict[str, Any]) -> None:
    real = recorded["plain/generate_logprob"]
    r = post(none_server, "/generate", real["request"])
    body = r.json()
    assert list(body["meta_info"]) == list(real["body_json"]["meta_info"])
    assert_same_shape(body, real["body_json"])
    meta = body["meta_info"]
    for (lp, tok, text), top, out_id in zip(
        meta["output_token_logprobs"], meta["output_top_logprobs"], body["output_ids"], strict=True
    ):
        assert tok == out_id and text is None and lp <= 0
        assert len(top) == 2 and top[0][0] >= top[1][0] and top[0][1] == tok  # greedy: the top token
    plain = recorded["plain/generate_greedy_1"]
    body = post(none_server, "/generate", plain["request"]).json()
    assert list(body["meta_info"]) == list(plain["body_json"]["meta_info"])  # no spec_* fields
    internal = get(none_server, "/server_info").json()["internal_states"][0]
    assert "avg_spec_accept_length" not in internal and internal["max_speculative_num_draft_tokens"] is None


def test_concurrent_streams_progress_together(none_server: RefServerProcess) -> None:
    marks: dict[int, list[float]] = {}
    # the four requests leave together: on a loaded machine a late-started client thread (not the server) sent
    # its request after another stream had already ended (seen once in a full CI run)
    together = threading.Barrier(4, timeout=30)

    def run(i: int) -> None:
        body = {"text": f"stream {i}", "sampling_params": {"temperature": 0, "max_new_tokens": 200}, "stream": True}
        together.wait()
        with httpx.stream("POST", none_server.url + "/generate", json=body, timeout=TIMEOUT) as r:
            marks[i] = [time.monotonic() for line in r.iter_lines() if line.startswith("data: {")]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(marks) == 4 and all(len(m) == 200 for m in marks.values())
    assert max(m[0] for m in marks.values()) < min(m[-1] for m in marks.values())  # all started before any ended


def test_log_lines_look_like_sglang(none_server: RefServerProcess) -> None:
    post(none_server, "/generate", {"text": "log", "sampling_params": {"temperature": 0, "max_new_tokens": 64}})
    log = none_server.log_text()
    stamp = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "
    assert re.search(rf"^{stamp}server_args=ServerArgs\(model_path='refserver/tiny-target', .*port=\d+", log, re.M)
    assert re.search(rf"^{stamp}INFO:     Uvicorn running on http://127\.0\.0\.1:{none_server.port} \(Press CTRL\+C to quit\)$",
                     log, re.M)  # fmt: skip
    assert re.search(rf'^{stamp}INFO:     127\.0\.0\.1:\d+ - "POST /generate HTTP/1\.1" 200 OK$', log, re.M)
    assert re.search(rf"^{stamp}The server is fired up and ready to roll!$", log, re.M)
    assert re.search(rf"^{stamp}Prefill batch, #new-seq: 1, #new-token: \d+, #cached-token: 0, ", log, re.M)
    assert re.search(rf"^{stamp}Decode batch, #running-req: \d+, #token: \d+, token usage: 0\.00, cuda graph: False, "
                     r"gen throughput \(token/s\): [\d.]+, #queue-req: 0$", log, re.M)  # fmt: skip


# --- DDTREE ------------------------------------------------------------------------------------------


def test_ddtree_refuses_logprobs_and_matches_none_greedily(
    ddtree_server: RefServerProcess, none_server: RefServerProcess
) -> None:
    r = post(ddtree_server, "/generate", {"text": "x", "return_logprob": True})
    message = "DFLASH speculative decoding does not support return_logprob yet."  # the real port's text, also for DDTREE
    assert (r.status_code, r.json()) == (400, {"error": {"message": message}})
    for prompt in ("The quick brown fox", "def fibonacci(n):", "1, 2, 3, 4, 5,"):
        body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 48}}
        a, b = post(none_server, "/generate", body).json(), post(ddtree_server, "/generate", body).json()
        assert a["output_ids"] == b["output_ids"]
        assert b["meta_info"]["spec_accept_length"] > 1.5
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "temperature": 0}
    a, b = post(none_server, "/v1/chat/completions", chat).json(), post(ddtree_server, "/v1/chat/completions", chat).json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]


def test_same_seed_samples_the_same_text_on_every_algorithm(
    none_server: RefServerProcess, dflash_server: RefServerProcess, ddtree_server: RefServerProcess
) -> None:
    body = {"text": "Sampling", "sampling_params": {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 40,
                                                    "sampling_seed": 11}}  # fmt: skip
    outs = [post(s, "/generate", body).json()["output_ids"] for s in (none_server, dflash_server, ddtree_server)]
    assert outs[0] == outs[1] == outs[2]
    other = post(none_server, "/generate", {**body, "sampling_params": {**body["sampling_params"], "sampling_seed": 12}})
    assert other.json()["output_ids"] != outs[0]


def test_spec_decode_log_line_shows_accept_length(ddtree_server: RefServerProcess) -> None:
    post(ddtree_server, "/generate", {"text": "decode", "sampling_params": {"temperature": 0, "max_new_tokens": 200}})
    line = re.search(r"Decode batch, .*accept len: ([\d.]+), accept rate: ([\d.]+), cuda graph", ddtree_server.log_text())
    assert line is not None and float(line.group(1)) > 1.0


# --- options ------------------------------------------------------------------------------------------


def test_api_key_is_required_and_never_logged() -> None:
    with RefServerProcess("--api-key", "sekrit-123") as server:
        assert get(server, "/v1/models").status_code == 401
        assert get(server, "/v1/models").json() == {"error": "Unauthorized"}
        ok = get(server, "/v1/models", headers={"Authorization": "Bearer sekrit-123"})
        assert ok.status_code == 200
        assert get(server, "/health").status_code == 200  # health stays open, as in SGLang
        assert get(server, "/server_info", headers={"Authorization": "Bearer sekrit-123"}).json()["api_key"] == "<redacted>"
        assert "sekrit-123" not in server.log_text()
