"""Every call of the HTTP client is bounded by total time, not per read (issue 24, item 3): a server that drips
its headers, its body, blank SSE lines or tokens cannot hold a call past its deadline, and the error names the
endpoint, the limit and how far the call got. Real servers on 127.0.0.1 (http_doubles.DripServer)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from http_doubles import DripServer, SilentServer, StallServer

from pytest_dflash.client.deadline import DeadlineExceeded
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.errors import ApiError

LIMIT_S = 1.0
SLACK_S = 1.0  # scheduling on a loaded 2-core machine


def client(url: str, limit_s: float = LIMIT_S) -> InferenceClient:
    return InferenceClient(url, service="drip", timeout=httpx.Timeout(limit_s, connect=5.0),
                           limit_name="--request-timeout")


def timed(call: object) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(ApiError) as caught:
        call()  # type: ignore[operator]
    return caught.value, time.monotonic() - started


def test_dripped_headers_end_at_the_deadline() -> None:
    with DripServer("headers", every_s=0.2) as server, client(server.url) as http:
        error, took = timed(lambda: http.server_info(timeout_s=LIMIT_S))
    assert isinstance(error, DeadlineExceeded), error
    assert took < LIMIT_S + SLACK_S, f"{took:.1f}s: the per-read timeout was the only bound"
    text = str(error)
    assert "/server_info" in text and "within 1s" in text and "nothing (not even the response headers)" in text, text
    assert error.cause == "timeout" and error.limit_s == LIMIT_S


def test_a_dripped_body_ends_at_the_deadline_and_says_what_came() -> None:
    with DripServer("body", every_s=0.2) as server, client(server.url) as http:
        error, took = timed(lambda: http.request("GET", "/v1/models"))
    assert isinstance(error, DeadlineExceeded), error
    assert took < LIMIT_S + SLACK_S, f"{took:.1f}s"
    assert "HTTP 200 headers and" in str(error) and "bytes of body" in str(error), error
    assert "--request-timeout" in str(error), error  # the documented limit it ran out of


@pytest.mark.parametrize("line", [b"\n", b": keep-alive\n\n"], ids=["blank-line", "sse-comment"])
def test_a_stream_of_blank_lines_or_comments_ends_at_the_deadline(line: bytes) -> None:
    with DripServer("sse", every_s=0.2, line=line) as server, client(server.url) as http:
        error, took = timed(lambda: http.generate_stream("Hi", Sampling(max_tokens=16)))
    assert isinstance(error, DeadlineExceeded), error
    assert took < LIMIT_S + SLACK_S, f"{took:.1f}s: blank lines bought the stream time"
    assert "/generate" in str(error) and "no token at all" in str(error), error
    assert error.tokens == 0


def test_a_slow_stream_says_how_many_tokens_at_what_pace() -> None:
    with DripServer("tokens", every_s=0.25) as server, client(server.url, 1.5) as http:
        error, took = timed(lambda: http.generate_stream("Hi", Sampling(max_tokens=64)))
    assert isinstance(error, DeadlineExceeded), error
    assert took < 1.5 + SLACK_S, f"{took:.1f}s"
    assert error.tokens is not None and 2 <= error.tokens <= 8, error
    assert error.per_token_s is not None and 0.1 < error.per_token_s < 0.8, error
    assert f"{error.tokens} tokens" in str(error) and "s per token" in str(error), error


def test_the_deadline_hook_adds_what_it_found() -> None:
    with DripServer("body", every_s=0.2) as server, client(server.url) as http:
        seen: list[DeadlineExceeded] = []

        def hook(error: DeadlineExceeded) -> str:
            seen.append(error)
            return "the engine makes no progress"

        http.on_deadline = hook
        error, _ = timed(lambda: http.generate("Hi"))
    assert seen and seen[0] is error
    assert str(error).endswith("the engine makes no progress"), error


def test_a_fast_answer_is_not_touched_by_the_deadline() -> None:
    with DripServer("headers", paths=("/drip",)) as server, client(server.url) as http:
        assert http.request("GET", "/v1/models").status_code == 200  # answered at once: no deadline error
        assert http.request("GET", "/v1/models").json() == {}


@pytest.mark.parametrize("call", ["flush_cache", "server_accept_length"])
def test_the_load_generators_side_calls_end_at_their_deadline(call: str) -> None:
    """The perf layer's /flush_cache and /server_info calls (load/serverinfo.py) are bounded by total time too (their
    streamed requests already are: load/sse.py runs each under asyncio.timeout)."""
    from pytest_dflash.load import serverinfo as load_run

    with DripServer("headers", every_s=0.2) as server:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout, match=r"no complete answer within 1s \(total time\)"):
            asyncio.run(getattr(load_run, call)(server.url, timeout_s=LIMIT_S))
        took = time.monotonic() - started
    assert took < LIMIT_S + SLACK_S, f"{took:.1f}s"


@pytest.mark.parametrize("call", ["server_info", "model_info"])
def test_the_older_name_gets_what_is_left_of_one_deadline_not_a_fresh_one(call: str) -> None:
    """The newer name answers "not served" late (at 0.8 of the limit), the older one is accepted and never
    answered: the call ends at its one total deadline (the older name gets what is left), not at 1.8 x."""
    limit_s = 2.0
    newer, older = ("/server_info", "/get_server_info") if call == "server_info" else ("/model_info",
                                                                                       "/get_model_info")
    with StallServer({newer: (404, 0.8 * limit_s)}) as server, client(server.url) as http:
        error, took = timed(lambda: getattr(http, call)(timeout_s=limit_s))
        asked = list(server.requests)
    assert asked[:2] == [newer, older], asked  # the older name was asked, after the newer one's 404
    assert error.cause == "timeout" and error.endpoint == older, error
    assert f"what was left of 2s of total time after {newer}" in str(error), error  # says why it had less time
    assert took < 1.5 * limit_s, f"{took:.1f}s for a {limit_s:g}s call: the older name got a deadline of its own"


def test_a_server_that_never_answers_costs_one_deadline() -> None:
    """Accepted and never answered on any path: one deadline in all (retries and both names included)."""
    with SilentServer() as server, client(server.url) as http:
        error, took = timed(lambda: http.server_info(timeout_s=LIMIT_S))
    assert error.cause == "timeout", error
    assert took < 1.5 * LIMIT_S, f"{took:.1f}s"
