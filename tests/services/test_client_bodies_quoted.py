"""A /generate (or OpenAI) answer that is not the object it should be is quoted as what it was: `[]` is "a JSON
list", never "{}" with "lacks text/meta_info" (the evidence must not misquote the server).

Real servers on 127.0.0.1: a refserver process, and a proxy in front of it that answers the odd body.
"""

from __future__ import annotations

from typing import Any

import pytest
from http_doubles import FaultProxy, Reply

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.errors import ApiError
from pytest_dflash.refserver.launch import RefServerProcess

FOUR = Sampling(max_tokens=4)


def _answer(path: str, body: bytes) -> Any:
    def rule(method: str, requested: str, payload: Any) -> Reply | None:
        return Reply(200, body) if method == "POST" and requested == path else None
    return rule


@pytest.mark.parametrize(("body", "said"), [
    (b"[]", "/generate: HTTP 200: response is an empty JSON list, not an object: []"),
    (b"null", "/generate: HTTP 200: response is JSON null, not an object: null"),
    (b'"ok"', '/generate: HTTP 200: response is a JSON string, not an object: "ok"'),
    (b'{"text": "hi"}', '/generate: HTTP 200: response lacks meta_info: {"text": "hi"}'),
    (b'{"text": "hi", "meta_info": []}',
     '/generate: HTTP 200: response\'s meta_info is an empty JSON list, not an object: {"text": "hi", '
     '"meta_info": []}'),
], ids=["empty-list", "null", "string", "no-meta", "meta-list"])
def test_a_generate_body_is_quoted_as_it_came(refserver: RefServerProcess, body: bytes, said: str) -> None:
    with FaultProxy(refserver.url, _answer("/generate", body)) as proxy, \
            InferenceClient(proxy.url, service="odd") as client, pytest.raises(ApiError) as caught:
        client.generate("Hello", FOUR, timeout_s=30)
    assert str(caught.value) == f"odd {said}"


def test_n_samples_answered_with_none_fail(refserver: RefServerProcess) -> None:
    """Before: an empty list of generations, which a seed-variation check would judge as if it were data."""
    with FaultProxy(refserver.url, _answer("/generate", b"[]")) as proxy, \
            InferenceClient(proxy.url, service="odd") as client, pytest.raises(ApiError) as caught:
        client.generate_many("Hello", Sampling(max_tokens=4, n=8, temperature=1.0), timeout_s=30)
    assert str(caught.value) == "odd /generate: HTTP 200: response is an empty JSON list, not 8 samples: []"


def test_an_openai_body_that_is_a_list_says_so(refserver: RefServerProcess) -> None:
    with FaultProxy(refserver.url, _answer("/v1/completions", b"[1]")) as proxy, \
            InferenceClient(proxy.url, service="odd") as client, pytest.raises(ApiError) as caught:
        client.completion("Hello", FOUR, timeout_s=30)
    assert str(caught.value) == "odd /v1/completions: HTTP 200: response is a JSON list, not an object: [1]"


DEEP = b"[" * 20_000  # json.loads recurses per level: a RecursionError, unless it is read as JSON nested too deep


def _every(path: str, body: bytes, method: str = "") -> Any:
    def rule(asked: str, requested: str, payload: Any) -> Reply | None:
        return Reply(200, body) if requested.split("?")[0] == path and asked in (method or asked,) else None
    return rule


@pytest.mark.parametrize(("path", "call"), [
    ("/server_info", lambda client: client.server_info(timeout_s=10)),
    ("/model_info", lambda client: client.model_info(timeout_s=10)),
    ("/v1/models", lambda client: client.models(timeout_s=10)),
    ("/generate", lambda client: client.generate("Hello", FOUR, timeout_s=30)),
    ("/v1/completions", lambda client: client.completion("Hello", FOUR, timeout_s=30)),
], ids=["server_info", "model_info", "models", "generate", "completions"])
@pytest.mark.parametrize(("body", "said"), [
    (DEEP, "malformed JSON body: JSON nested too deep"),
    (b"<html>nope</html>", "malformed JSON body: Expecting value"),
], ids=["nested-too-deep", "not-json"])
def test_an_answer_that_is_not_json_is_an_api_error_naming_the_endpoint(
        refserver: RefServerProcess, path: str, call: Any, body: bytes, said: str) -> None:
    """Every call that reads JSON decodes it in one place (client/bodies.py answer_json): garbage or nesting
    too deep is an ApiError naming the endpoint and quoting the body's start, never a RecursionError."""
    with FaultProxy(refserver.url, _every(path, body)) as proxy, \
            InferenceClient(proxy.url, service="odd") as client, pytest.raises(ApiError) as caught:
        call(client)
    assert str(caught.value).startswith(f"odd {path}: HTTP 200: {said}"), caught.value
    assert caught.value.body == body[:300].decode()


def test_an_error_body_nested_too_deep_is_quoted_as_it_came(refserver: RefServerProcess) -> None:
    def rule(method: str, path: str, payload: Any) -> Reply | None:
        return Reply(400, DEEP) if path == "/generate" else None
    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url, service="odd") as client, \
            pytest.raises(ApiError) as caught:
        client.generate("Hello", FOUR, timeout_s=30)
    assert caught.value.status == 400 and caught.value.message == "[" * 300


def test_a_stream_event_nested_too_deep_is_an_api_error(refserver: RefServerProcess) -> None:
    event = b"data: " + b"[" * 5000 + b"]" * 5000 + b"\n\n"
    with FaultProxy(refserver.url, lambda m, p, b: Reply(200, event, "text/event-stream")
                    if p == "/generate" else None) as proxy, \
            InferenceClient(proxy.url, service="odd") as client, pytest.raises(ApiError) as caught:
        client.stream("/generate", {"text": "Hello", "stream": True, "sampling_params": {"max_new_tokens": 4}})
    assert "SSE event is not JSON (JSON nested too deep" in caught.value.message
