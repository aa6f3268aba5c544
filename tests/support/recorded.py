"""Fixtures of the generation and parity self-tests: real recorded SGLang responses, and clients that replay them.

Registered as a plugin by tests/layers/generation/conftest.py and tests/layers/parity/conftest.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_dflash.client.inference import InferenceClient

DATA = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200" / "parity"
Handler = Callable[[dict[str, Any]], tuple[int, Any]]


@pytest.fixture(scope="session")
def recorded() -> dict[str, Any]:
    """Verbatim calls to a real SGLang 0.5.17 plain / DFLASH server (tests/data/.../parity/README.md)."""
    data: dict[str, Any] = json.loads((DATA / "recorded.json").read_text())
    return data


def replay_client(handler: Handler, *, service: str = "replay",
                  routes: dict[str, Callable[[], tuple[int, Any]]] | None = None) -> InferenceClient:
    """An InferenceClient whose requests `handler(body) -> (status, json)` answers (or `routes[path]()`); no network."""

    def respond(request: httpx.Request) -> httpx.Response:
        if routes and request.url.path in routes:
            status, body = routes[request.url.path]()
        else:
            status, body = handler(json.loads(request.content or b"{}"))
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    client = InferenceClient("http://replay.invalid", service=service)
    client._http = httpx.Client(base_url="http://replay.invalid", transport=httpx.MockTransport(respond))
    return client


@pytest.fixture
def replay() -> Callable[..., InferenceClient]:
    """replay(handler) -> a client whose requests `handler(body) -> (status, json)` answers."""
    return replay_client
