"""Total deadlines, enforced below httpx: every socket operation of a call (connect, write, each read) is
given at most the time left before the calling thread's deadline, so a server that drips a byte at a time
cannot hold a call past its `timeout_s`. `DeadlineExceeded` says how far the call got (`CallProgress`)."""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from pytest_dflash.errors import ApiError


class _Deadline(threading.local):
    """The monotonic time by which this thread's current call must be done (None: no call in progress)."""

    at: float | None = None


_DEADLINE = _Deadline()


def _time_left(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout` (a per-operation timeout) cut to the time left before this thread's deadline."""
    at = _DEADLINE.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the call's total deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every operation gets at most the time left before the calling thread's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     _time_left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network backend with the calling thread's deadline applied to every connection it makes."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port,
                                                       _time_left(timeout, httpcore.ConnectTimeout),
                                                       local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path,
                                                               _time_left(timeout, httpcore.ConnectTimeout),
                                                               socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bound_total_time(client: httpx.Client) -> httpx.Client:
    """Give every connection `client` makes (directly or through an environment proxy) the calling thread's
    deadline. httpx has no public hook below its per-read timeouts, so this wraps the network backend of
    each httpcore pool; it fails loudly if a new httpx moved it (a call without a deadline must not pass)."""
    transports = [client._transport, *(t for t in client._mounts.values() if t is not None)]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if not isinstance(backend, httpcore.NetworkBackend):
            raise RuntimeError(f"httpx {httpx.__version__}: cannot bound the total time of HTTP calls "
                               f"({type(transport).__name__} has no httpcore pool with a network backend)")
        if not isinstance(backend, _DeadlineBackend):
            pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]
    return client


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Bound every HTTP operation of this thread (on a `bound_total_time` client) to `seconds` from now, in
    all; yields the monotonic deadline. An inner deadline never extends an outer one."""
    outer = _DEADLINE.at
    at = time.monotonic() + seconds
    _DEADLINE.at = at if outer is None else min(at, outer)
    try:
        yield _DEADLINE.at
    finally:
        _DEADLINE.at = outer


@dataclass(eq=False)
class DeadlineExceeded(ApiError):
    """A call ran out of its total time: the endpoint, the limit, and how far it got."""

    limit_s: float = 0.0
    elapsed_s: float = 0.0
    got: str = ""  # "no HTTP response headers", "HTTP 200 and 120 bytes of body", "5 SSE events, 4 tokens …"
    tokens: int | None = None  # tokens seen in a stream (None: not a stream, or nothing countable)
    per_token_s: float | None = None  # seconds per token over the tokens seen (None: fewer than one)
    limit_name: str = ""  # where the limit comes from: "--request-timeout", "timeout_s", …
    method: str = ""


@dataclass
class CallProgress:
    """How far one call got, for the error that says so when it runs out of time."""

    started: float
    deadline: float
    limit_s: float
    status: int | None = None
    bytes: int = 0
    events: int = 0
    tokens: int = 0
    token_times: list[float] = field(default_factory=list)  # seconds from the start at which tokens arrived
    stream: bool = False
    method: str = "GET"

    @property
    def overdue(self) -> bool:
        # a socket timeout cut to the deadline may fire a hair before it (poll's millisecond resolution)
        return time.monotonic() >= self.deadline - 0.01

    def tokens_seen(self, count: int) -> None:
        if count > self.tokens:
            now = time.monotonic() - self.started
            self.token_times.extend([now] * (count - self.tokens))
            self.tokens = count

    def describe(self) -> tuple[str, float | None]:
        """What the call got, in words; and seconds per token (None: under one token)."""
        if self.status is None:
            return "nothing (not even the response headers)", None
        if not self.stream:
            return f"HTTP {self.status} headers and {self.bytes} bytes of body, not the whole body", None
        if not self.tokens:
            return (f"HTTP {self.status}, {self.bytes} bytes in {self.events} SSE events, no token at all: "
                    "the stream never carried a token"), None
        first = self.token_times[0]
        # the pace of decoding: between the first token and the last (the first one also waited for the
        # prefill)
        per_token = ((self.token_times[-1] - first) / (self.tokens - 1) if self.tokens > 1
                     else time.monotonic() - self.started)
        return (f"HTTP {self.status}, {self.tokens} tokens in {self.events} SSE events, {per_token:.2f} s "
                f"per token (first after {first:.1f} s)"), per_token


