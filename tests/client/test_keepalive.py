"""Idle keep-alive connections retire before SGLang's uvicorn closes them (client/connect.py REUSE_IDLE_S).

uvicorn closes a connection idle for 5 s; a client that reuses one idle for ~5 s can send its request into that
close and read a reset from a healthy server (CI saw exactly that behind a proxy). Both clients, the checks'
InferenceClient and the load transport, open a fresh connection once one has idled REUSE_IDLE_S, and keep
reusing one that idled less. A real loopback HTTP/1.1 server counts the connections it accepted.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from pytest_dflash.client.connect import REUSE_IDLE_S
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.load.transport import REUSE_IDLE_S as LOAD_REUSE_IDLE_S
from pytest_dflash.load.transport import make_client

MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


class CountingServer:
    """HTTP/1.1 keep-alive on 127.0.0.1 that answers /v1/models and counts accepted connections."""

    def __init__(self) -> None:
        self.accepted = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                server.accepted += 1
                super().setup()

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(MODELS)))
                self.end_headers()
                self.wfile.write(MODELS)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def server() -> Iterator[CountingServer]:
    counting = CountingServer()
    yield counting
    counting.close()


RETIRED_IDLE_S = 3.0  # past REUSE_IDLE_S, still 2 s before uvicorn's close: this connection is not reused


@pytest.mark.parametrize("reuse_idle_s", [REUSE_IDLE_S, LOAD_REUSE_IDLE_S], ids=["checks", "load"])
def test_the_retirement_comes_well_before_uvicorns_close(reuse_idle_s: float) -> None:
    assert reuse_idle_s < RETIRED_IDLE_S <= 5.0 - 2.0  # margin for a response still on its way


@pytest.mark.parametrize(("idle_s", "connections"), [(0.2, 1), (RETIRED_IDLE_S, 2)],
                         ids=["reused", "retired"])
def test_the_checks_client_reuses_only_a_recently_idle_connection(server: CountingServer, idle_s: float,
                                                                   connections: int) -> None:
    client = InferenceClient(server.url)
    try:
        assert client.models() == ["m"]
        time.sleep(idle_s)
        assert client.models() == ["m"]
    finally:
        client.close()
    assert server.accepted == connections


@pytest.mark.parametrize("stamped", [True, False], ids=["stamped", "httpx"])
@pytest.mark.parametrize(("idle_s", "connections"), [(0.2, 1), (RETIRED_IDLE_S, 2)],
                         ids=["reused", "retired"])
def test_the_load_client_reuses_only_a_recently_idle_connection(server: CountingServer, idle_s: float,
                                                                 connections: int, stamped: bool) -> None:
    async def twice() -> None:
        async with make_client(server.url, limit=4, timeout=httpx.Timeout(10.0), stamped=stamped) as client:
            assert (await client.get("/v1/models")).json()["data"][0]["id"] == "m"
            await asyncio.sleep(idle_s)
            assert (await client.get("/v1/models")).json()["data"][0]["id"] == "m"

    asyncio.run(twice())
    assert server.accepted == connections
