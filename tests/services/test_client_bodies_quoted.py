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
