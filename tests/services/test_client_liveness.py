"""After readiness, a service reached only by URL is checked after every test by one TCP connect: a refusal is
conclusive (nothing listens any more), anything else is not. Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket

import pytest

from pytest_dflash.client.inference import InferenceClient


def test_a_listening_server_is_not_refused_and_a_closed_one_is() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = InferenceClient(f"http://127.0.0.1:{server.getsockname()[1]}")
    try:
        assert client.refuses_connections(2.0) is False
        server.close()
        assert client.refuses_connections(2.0) is True
    finally:
        server.close()
        client.close()


def test_a_name_that_does_not_resolve_is_not_judged_refused() -> None:
    with InferenceClient("http://no-such-host.invalid:30000") as client:
        assert client.refuses_connections(2.0) is None


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "https_proxy", "ALL_PROXY"])
def test_behind_a_proxy_from_the_environment_a_connect_does_not_judge(monkeypatch: pytest.MonkeyPatch,
                                                                       variable: str) -> None:
    """httpx sends through the proxy, so the server's own port says nothing: the caller asks over HTTP."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.close()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "http://127.0.0.1:9")
    with InferenceClient(f"http://127.0.0.1:{port}") as client:
        assert client.refuses_connections(2.0) is None
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # bypassed: the connect is what httpx would do
    with InferenceClient(f"http://127.0.0.1:{port}") as client:
        assert client.refuses_connections(2.0) is True
