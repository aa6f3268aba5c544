"""Parity compares token ids: an answer without them is an error, never "token-identical" (greedy and
grammar-constrained parity).

A real refserver process behind a real proxy on 127.0.0.1 that drops `output_ids` from /generate answers (a
gateway or an SGLang build that does not return them)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from services.http_doubles import FaultProxy, Reply

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.generation.structured import GRAMMARS
from pytest_dflash.layers.parity.greedy import greedy_outputs
from pytest_dflash.layers.parity.prompts import Prompt
from pytest_dflash.layers.parity.structured import constrained_greedy
from pytest_dflash.refserver.launch import RefServerProcess


def without_ids(upstream: str) -> Any:
    def rule(method: str, path: str, body: Any) -> Reply | None:
        if method != "POST" or path != "/generate":
            return None
        answer = httpx.post(upstream + path, json=body, timeout=60.0).json()
        answer.pop("output_ids", None)
        return Reply(200, json.dumps(answer).encode())
    return rule


def test_an_answer_without_output_ids_is_an_error_not_a_match() -> None:
    """Two answers without ids once compared as () == (): every pair "token-identical", nothing compared."""
    with RefServerProcess("--speculative-algorithm", "NONE", "--constrained-json-disable-any-whitespace") as server, \
            FaultProxy(server.url, without_ids(server.url)) as proxy, InferenceClient(proxy.url) as client, \
            InferenceClient(server.url) as direct:
        run = constrained_greedy(direct, "Hello world!", GRAMMARS["regex"])
        assert run.ids and run.finish in ("stop", "length")
        with pytest.raises(ApiError, match="the answer carries no output_ids"):
            constrained_greedy(client, "Hello world!", GRAMMARS["regex"])


def test_greedy_outputs_without_output_ids_are_an_error_not_a_match() -> None:
    """Greedy parity once passed two servers whose answers both lacked output_ids: () == () on every prompt."""
    prompts = [Prompt("fox", "The quick brown fox"), Prompt("hello", "Hello world!")]
    with RefServerProcess("--speculative-algorithm", "NONE") as server, \
            FaultProxy(server.url, without_ids(server.url)) as proxy, InferenceClient(proxy.url) as client, \
            InferenceClient(server.url) as direct:
        assert all(g.output_ids for g in greedy_outputs(direct, prompts, max_tokens=8))
        for concurrent_requests in (False, True):
            with pytest.raises(ApiError, match="the answer to 'fox' carries no output_ids"):
                greedy_outputs(client, prompts, max_tokens=8, concurrent_requests=concurrent_requests)
