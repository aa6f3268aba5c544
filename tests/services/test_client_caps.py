"""Response bodies are read with a byte cap: a body far larger than the request allows fails with its size.

Real servers on 127.0.0.1: a refserver process, and a proxy in front of it that answers megabytes.
"""

from __future__ import annotations

import json
import re

import pytest
from http_doubles import FaultProxy, Reply, huge_generation

from pytest_dflash.client.bodies import DEFAULT_MAX_BODY, METRICS_MAX_BODY, response_cap
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import GREEDY, Sampling
from pytest_dflash.errors import ApiError
from pytest_dflash.refserver.launch import RefServerProcess

FOUR = Sampling(max_tokens=4)


@pytest.mark.parametrize(
    ("path", "body", "low", "high"),
    [
        ("/v1/models", None, DEFAULT_MAX_BODY, DEFAULT_MAX_BODY),
        ("/server_info", None, DEFAULT_MAX_BODY, DEFAULT_MAX_BODY),
        ("/metrics", None, METRICS_MAX_BODY, METRICS_MAX_BODY),
        # max_tokens=4: a few tens of KB, never megabytes
        ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 4}}, 64 * 1024, 80 * 1024),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 4}, 64 * 1024, 80 * 1024),
        # the cap grows with what the request allows: tokens, n, prompts, top logprobs
        ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2048}}, 1024 * 1024, 2 * 1024 * 1024),
        ("/generate", {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 1024, "n": 2}},
         2 * 1024 * 1024, 3 * 1024 * 1024),
        ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 20,
                       "sampling_params": {"max_new_tokens": 512}}, 1536 * 1024, 2 * 1024 * 1024),
        # no max_tokens: SGLang's chat generates up to the context length
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, 16 * 1024 * 1024,
         17 * 1024 * 1024),
    ],
)
def test_response_cap_follows_what_the_request_allows(path: str, body: object, low: int, high: int) -> None:
    assert low <= response_cap(path, body) <= high


def test_real_responses_fit_their_caps(refserver: RefServerProcess) -> None:
    """The healthy case: every endpoint the suites read answers well under its cap."""
    with InferenceClient(refserver.url, service="ref") as client:
        assert client.generate("Hello", FOUR).completion_tokens == 4
        assert client.completion("Hello", Sampling(max_tokens=64, n=3))
        assert client.generate_stream("Hello", Sampling(max_tokens=64)).done
        assert client.server_info() is not None
        assert "sglang:" in client.metrics()
        long = client.generate("Hello", Sampling(max_tokens=256, ignore_eos=True))
        assert long.completion_tokens == 256


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_megabytes_for_max_tokens_4_fail_with_their_size(refserver: RefServerProcess, chunked: bool) -> None:
    with FaultProxy(refserver.url, huge_generation(8 * 1024 * 1024, chunked=chunked)) as proxy, \
            InferenceClient(proxy.url, service="big") as client, pytest.raises(ApiError) as caught:
        client.generate("Hello", FOUR, timeout_s=30)
    error = caught.value
    cap = response_cap("/generate", {"text": "Hello", "sampling_params": FOUR.as_sglang()})
    assert error.cause == "too-large" and error.status == 200
    assert f"over the {cap}-byte cap" in error.message
    if chunked:  # no size announced: reading stops just past the cap
        read = int(re.search(r"(\d+)\+ bytes read", error.message).group(1))  # type: ignore[union-attr]
        assert cap < read < cap + 256 * 1024, error.message
    else:  # announced: refused before reading
        assert "Content-Length 8388608 bytes" in error.message, error.message
    assert len(str(error)) < 1000  # what reaches the reports is the size, never the body


def test_a_large_body_that_the_request_allows_is_read(refserver: RefServerProcess) -> None:
    """2 MB answering 4096 tokens is legitimate (text, ids and meta for every token)."""
    rule = huge_generation(2 * 1024 * 1024, chunked=True)
    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url, service="big") as client:
        generation = client.generate("Hello", Sampling(max_tokens=4096), timeout_s=30)
    assert len(generation.text) > 2_000_000


def test_metrics_get_a_larger_cap_than_other_endpoints(refserver: RefServerProcess) -> None:
    body = ("sglang:x{le=\"1\"} 1\n" * 100_000).encode()  # ~2 MB of Prometheus text: a busy server's histograms
    assert DEFAULT_MAX_BODY < len(body) < METRICS_MAX_BODY

    def rule(method: str, path: str, _: object) -> Reply | None:
        return Reply(200, body, "text/plain") if path in ("/metrics", "/server_info") else None

    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url, service="m") as client:
        assert len(client.metrics()) == len(body)
        with pytest.raises(ApiError, match="response body too large"):
            client.server_info()


def test_an_sse_event_larger_than_the_request_allows_fails(refserver: RefServerProcess) -> None:
    event = b"data: " + json.dumps({"text": "x" * 4_000_000}).encode() + b"\n\n"

    def rule(method: str, path: str, body: object) -> Reply | None:
        return Reply(200, event, "text/event-stream", chunked=True) if path == "/generate" else None

    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url, service="sse") as client, \
            pytest.raises(ApiError) as caught:
        client.generate_stream("Hello", GREEDY, timeout_s=30)
    assert caught.value.cause == "too-large" and "an SSE line of" in caught.value.message


@pytest.mark.parametrize("body", [
    b"\x1b[2J\x1b]0;PWNED\x07 boom\n::error::injected",
    json.dumps({"object": "error", "message": "\x1b[2J\x1b]0;PWNED\x07 boom\n::error::injected"}).encode(),
], ids=["text", "json"])
def test_an_error_body_reaches_the_message_with_its_control_characters_written_out(
        refserver: RefServerProcess, body: bytes) -> None:
    def rule(method: str, path: str, _: object) -> Reply | None:
        return Reply(500, body, "text/plain") if path == "/generate" else None

    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url, service="hostile") as client, \
            pytest.raises(ApiError) as caught:
        client.generate("Hello", FOUR)
    message = caught.value.message
    assert "\\x1b[2J\\x1b]0;PWNED\\x07 boom" in message
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", message)
    assert not any(line.lstrip().startswith("::") for line in message.splitlines()), message
