"""Metadata routes (/server_info, /model_info, /metrics) ride out a transient answer: a 5xx is asked again within
the call's own total time, and only "not served" (404, 405, ...) on every path means "not SGLang".

A real refserver process behind a real proxy on 127.0.0.1 that answers some of its GETs itself."""

from __future__ import annotations

import time

import pytest
from http_doubles import FaultProxy, FlakyRoute, Reply

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.errors import ApiError
from pytest_dflash.refserver.launch import RefServerProcess


@pytest.mark.parametrize("status", [503, 501])
def test_two_5xx_on_server_info_are_ridden_out(refserver: RefServerProcess, status: int) -> None:
    """A gateway's passing 503 or 501 (Not Implemented: some proxies answer it for a while, or for a method they
    do not forward) is asked again."""
    rule = FlakyRoute(status=status, times=2)
    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url) as client:
        info = client.server_info()
    assert info is not None and info["speculative_algorithm"] == "DFLASH"
    assert rule.replaced == 2


@pytest.mark.parametrize("path", ["/model_info", "/metrics"])
def test_the_other_metadata_routes_are_retried_too(refserver: RefServerProcess, path: str) -> None:
    rule = FlakyRoute(paths=(path,), status=502, times=1)
    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url) as client:
        answer = client.model_info() if path == "/model_info" else client.metrics()
    assert answer and rule.replaced == 1


def test_a_5xx_that_never_ends_is_an_error_within_the_calls_time_never_not_sglang(
        refserver: RefServerProcess) -> None:
    rule = FlakyRoute(status=503, times=None)
    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url) as client:
        started = time.monotonic()
        with pytest.raises(ApiError) as caught:
            client.server_info(timeout_s=3)
        took = time.monotonic() - started
    assert caught.value.status == 503 and took < 4, took
    assert rule.replaced >= 3  # asked again, not answered at the first 503


@pytest.mark.parametrize("status", [404, 405, 410])
def test_only_not_served_on_every_path_means_not_sglang(refserver: RefServerProcess, status: int) -> None:
    rule = FlakyRoute(status=status, times=None)
    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url) as client:
        assert client.server_info() is None
    assert rule.replaced == 2  # both names, each once: a "not served" is not retried


@pytest.mark.parametrize("call", ["server_info", "model_info"])
def test_a_501_that_never_ends_names_its_status_and_is_never_not_sglang(refserver: RefServerProcess,
                                                                        call: str) -> None:
    """SGLang answers an unknown path 404 (recorded on 0.5.17) and a wrong method 405 (FastAPI), never 501: a 501
    on a route SGLang always serves comes from something in between, so it says nothing about the server. Still
    501 when the call's time is spent: an error naming HTTP 501 (its checks could not be made), not None."""
    paths = ("/server_info", "/get_server_info") if call == "server_info" else ("/model_info", "/get_model_info")
    rule = FlakyRoute(paths=paths, status=501, times=None)
    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url) as client:
        started = time.monotonic()
        with pytest.raises(ApiError) as caught:
            getattr(client, call)(timeout_s=3)
        took = time.monotonic() - started
    assert caught.value.status == 501 and caught.value.endpoint == paths[0], caught.value
    assert "HTTP 501" in str(caught.value) and took < 4, (str(caught.value), took)
    assert rule.replaced >= 3  # asked again within the call's time, as any 5xx


def test_a_last_try_cut_short_does_not_hide_the_status_the_earlier_ones_got(refserver: RefServerProcess) -> None:
    """501 at once, then every later try held unanswered: when the call's time is spent, the error names the HTTP
    501 the route kept answering, not only "timed out" (the last try was cut short by the deadline)."""
    asked = {"n": 0}

    def rule(method: str, path: str, body: object) -> Reply | None:
        if method != "GET" or path != "/server_info":
            return None
        asked["n"] += 1
        if asked["n"] == 1:
            return Reply(501, b'{"error": "HTTP 501 from the proxy"}')
        return Reply(200, b" ", drip_every_s=0.2, drip_for_s=10.0)  # headers, then a body that never ends

    with FaultProxy(refserver.url, rule) as proxy, InferenceClient(proxy.url) as client, \
            pytest.raises(ApiError) as caught:
        client.server_info(timeout_s=2)
    assert asked["n"] >= 2, asked  # asked again after the 501
    assert caught.value.status == 501 and "HTTP 501" in str(caught.value), caught.value
