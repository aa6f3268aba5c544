"""HTTP/1.1 transport for httpx that stamps every read at ``data_received``, and :func:`make_client`.

The clock is read when the bytes reach user space, not when a parser gets to them (see the package
docstring); the sibling modules read the stamp from :class:`Connection`, the response's
``network_stream``.

Why hand-written, measured side by side with an aiohttp client written as sglang's bench_serving
writes it (benchmarks/aiohttp_ab.py, same synthetic server and prompts, 5 interleaved runs on a
shared 2-core machine, medians): at a client-bound load (256 tokens in one write, concurrency 32)
this transport takes 263k output tokens per client CPU-second against aiohttp's 143k (1.8x); at a
light load (TTFT 50 ms, ITL 10 ms, concurrency 8) its TTFT p50 error is +0.16 ms against +1.20 ms.
It does not win everywhere: at that light load the whole client used slightly more CPU per token
than aiohttp (11.3k vs 12.3k tokens per CPU-s; the 10 ms lag ticker of :mod:`.monitor` is most of
a client's work there), which is immaterial at 0.07 of a core."""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import cast

import httpx

__all__ = ["REUSE_IDLE_S", "Connection", "make_client"]

# SGLang's uvicorn closes a connection idle for 5 s (timeout_keep_alive=5): a request sent into that close
# reads a reset, an error a healthy server never meant. Connections idle this long are closed instead of
# reused (client/connect.py keeps the same rule for the checks' client; load/ may not import it).
REUSE_IDLE_S = 2.0


class _Protocol(asyncio.Protocol):
    """Buffers received bytes with the perf_counter_ns() at which they reached user space."""

    _HIGH_WATER = 4 << 20

    def __init__(self) -> None:
        self.chunks: collections.deque[tuple[bytes, int]] = collections.deque()
        self.buffered = 0
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None
        self.eof = False
        self.lost = False
        self.exc: BaseException | None = None
        self.write_paused = False
        self.read_paused = False

    def data_received(self, data: bytes) -> None:
        self.chunks.append((data, time.perf_counter_ns()))
        self.buffered += len(data)
        if self.buffered > self._HIGH_WATER and not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.exc = exc
        self._wake()
        d = self.drain_waiter
        if d is not None and not d.done():
            d.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        d = self.drain_waiter
        if d is not None and not d.done():
            d.set_result(None)

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class Connection:
    """One HTTP/1.1 connection: corked request writes, stamped reads."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol,
                 origin: tuple[str, str, int]) -> None:
        self.transport = transport
        self.p = protocol
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.last_read_ns = 0  # arrival of the bytes returned by the last read()
        self.request_start_ns = 0  # the request (head + body, one write) handed to the kernel
        self.idle_since = 0.0  # monotonic time it went back to the pool

    def usable(self) -> bool:
        """True when an idle connection can take a request (the server did not close it)."""
        p = self.p
        return not (p.lost or p.eof or p.chunks or self.transport.is_closing())

    def reusable(self) -> bool:
        """Usable, and idle for less than REUSE_IDLE_S: the server is not about to close it."""
        return self.usable() and time.monotonic() - self.idle_since < REUSE_IDLE_S

    async def send(self, data: bytes, request: httpx.Request, timeout: float | None) -> None:
        p = self.p
        if p.lost or self.transport.is_closing():
            raise httpx.WriteError("connection lost before the request was sent", request=request)
        self.request_start_ns = time.perf_counter_ns()
        self.transport.write(data)
        if p.write_paused:
            fut: asyncio.Future[None] = self.loop.create_future()
            p.drain_waiter = fut
            handle = self.loop.call_later(timeout, _expire, fut) if timeout is not None else None
            try:
                await fut
            except TimeoutError:
                raise httpx.WriteTimeout(f"request body blocked for {timeout} s", request=request) from None
            finally:
                p.drain_waiter = None
                if handle is not None:
                    handle.cancel()
            if p.lost:
                raise httpx.WriteError("connection lost while sending the request", request=request)

    async def read(self, request: httpx.Request, timeout: float | None) -> bytes:
        """Next received bytes (b"" at EOF); sets ``last_read_ns`` to their arrival time."""
        p = self.p
        if not p.chunks:
            if not (p.lost or p.eof):
                fut: asyncio.Future[None] = self.loop.create_future()
                p.waiter = fut
                handle = self.loop.call_later(timeout, _expire, fut) if timeout is not None else None
                try:
                    await fut
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no data for {timeout} s", request=request) from None
                finally:
                    p.waiter = None
                    if handle is not None:
                        handle.cancel()
            if not p.chunks:
                if p.exc is not None:
                    raise httpx.ReadError(f"{type(p.exc).__name__}: {p.exc}", request=request)
                return b""
        data, ts = p.chunks.popleft()
        p.buffered -= len(data)
        if p.read_paused and p.buffered < _Protocol._HIGH_WATER // 4:
            p.read_paused = False
            self.transport.resume_reading()
        self.last_read_ns = ts
        return data

    def close(self) -> None:
        self.transport.close()


_MAX_HEAD = 64 * 1024


class _Body(httpx.AsyncByteStream):
    """A response body read straight off the connection: one piece per read, de-chunked."""

    def __init__(self, transport: _H1Transport, conn: Connection, request: httpx.Request, rest: bytes,
                 rest_ns: int, framing: str, length: int, reusable: bool, timeout: float | None) -> None:
        self._t = transport
        self.conn = conn
        self._request = request
        self._rest = rest
        self._rest_ns = rest_ns
        self._framing = framing  # "chunked" | "length" | "close" | "none"
        self._left = length
        self._reusable = reusable
        self._timeout = timeout
        self._done = framing == "none" or (framing == "length" and length == 0)
        self._closed = False
        # chunked decoder state
        self._buf = b""
        self._in_chunk = 0  # bytes of chunk data still to come
        self._need_crlf = False
        self._trailers = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn, request = self.conn, self._request
        if self._rest:
            data, self._rest = self._rest, b""
            conn.last_read_ns = self._rest_ns
            out = self._feed(data)
            if out:
                yield out
        while not self._done:
            data = await conn.read(request, self._timeout)
            if not data:
                if self._framing == "close":
                    self._done = True
                    self._reusable = False
                    break
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body", request=request)
            out = self._feed(data)
            if out:
                yield out

    def _feed(self, data: bytes) -> bytes:
        framing = self._framing
        if framing == "close":
            return data
        if framing == "length":
            if len(data) >= self._left:
                extra = data[self._left:]
                data = data[: self._left]
                self._left = 0
                self._done = True
                if extra:
                    self._reusable = False
                return data
            self._left -= len(data)
            return data
        return self._dechunk(data)

    def _dechunk(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        out: list[bytes] = []
        while pos < n or self._done:
            if self._done:
                if pos < n:
                    self._reusable = False  # bytes after the end of the message
                break
            if self._in_chunk:
                take = min(self._in_chunk, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._in_chunk -= take
                if self._in_chunk:
                    break
                self._need_crlf = True
            if self._need_crlf:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("malformed chunked encoding: no CRLF after chunk data",
                                                    request=self._request)
                pos += 2
                self._need_crlf = False
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 4096:
                    raise httpx.RemoteProtocolError("malformed chunked encoding: chunk header too long",
                                                    request=self._request)
                break
            line = buf[pos:eol]
            pos = eol + 2
            if self._trailers:
                if not line:
                    self._done = True
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"malformed chunk size line {line[:40]!r}",
                                                request=self._request) from None
            if size < 0:
                raise httpx.RemoteProtocolError("negative chunk size", request=self._request)
            if size == 0:
                self._trailers = True
            else:
                self._in_chunk = size
        self._buf = buf[pos:] if pos < n else b""
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._done and self._reusable and not self._buf:
            self._t._release(self.conn)
        else:
            self._t._discard(self.conn)


class _H1Transport(httpx.AsyncBaseTransport):
    """httpx transport: HTTP/1.1 keep-alive pool on asyncio protocols, stamped reads.

    Why not httpcore + h11: h11 turns every chunk of a chunked response into an event object and
    a trip through four async generators; an SSE stream is one chunk per token, so that was 60 % of
    the client's CPU. Here a response body is de-chunked per *read* (often a hundred tokens at once
    under load), and every piece carries the arrival time of the read it came from.
    """

    def __init__(self, *, max_connections: int | None, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._all: set[Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        conn = await self._acquire(origin, request, timeouts)
        try:
            body = await request.aread()
            head = b"%s %s HTTP/1.1\r\n" % (request.method.encode(), url.raw_path)
            lines = [head]
            for name, value in request.headers.raw:
                lines.append(b"%s: %s\r\n" % (name, value))
            lines.append(b"\r\n")
            if body:
                lines.append(body)
            await conn.send(b"".join(lines), request, timeouts.get("write"))
            return await self._response(conn, request, timeouts.get("read"))
        except BaseException:
            self._discard(conn)
            raise

    async def _acquire(self, origin: tuple[str, str, int], request: httpx.Request,
                       timeouts: Mapping[str, float | None]) -> Connection:
        """A connection for one request: an idle one if usable, else a new one (a slot each)."""
        if self._slots is not None:
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no free connection in the pool", request=request) from None
        try:
            idle = self._idle.get(origin)
            while idle:
                conn = idle.pop()
                if conn.reusable():
                    return conn
                self._all.discard(conn)
                conn.close()
            return await self._connect(origin, request, timeouts.get("connect"))
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    async def _connect(self, origin: tuple[str, str, int], request: httpx.Request,
                       timeout: float | None) -> Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        ssl_ctx: ssl.SSLContext | None = None
        if scheme == "https":
            ssl_ctx = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    _Protocol, host, port, ssl=ssl_ctx, server_hostname=host if ssl_ctx else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out after {timeout} s",
                                       request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"connect to {host}:{port}: {exc}", request=request) from exc
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(transport, protocol, origin)
        self._all.add(conn)
        return conn

    async def _response(self, conn: Connection, request: httpx.Request,
                        timeout: float | None) -> httpx.Response:
        buf = b""
        while True:
            data = await conn.read(request, timeout)
            if not data:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                                request=request)
            buf = buf + data if buf else data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise httpx.RemoteProtocolError("response head too large", request=request)
                continue
            head, buf = buf[:end], buf[end + 4:]
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}", request=request)
            status = int(parts[1])
            if 100 <= status < 200:  # informational (100 Continue): the real answer follows
                if buf:
                    conn.p.chunks.appendleft((buf, conn.last_read_ns))
                    conn.p.buffered += len(buf)
                buf = b""
                continue
            break
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}", request=request)
            headers.append((name.strip(), value.strip()))
        framing, length, keep = "close", 0, parts[0] != b"HTTP/1.0"
        for name, value in headers:
            lname = name.lower()
            if lname == b"transfer-encoding" and b"chunked" in value.lower():
                framing = "chunked"
            elif lname == b"content-length" and framing != "chunked":
                try:
                    length = int(value)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad content-length {value!r}",
                                                    request=request) from None
                framing = "length"
            elif lname == b"connection":
                v = value.lower()
                if b"close" in v:
                    keep = False
                elif b"keep-alive" in v:
                    keep = True
        if request.method == "HEAD" or status in (204, 304):
            framing = "none"
        if framing == "close":
            keep = False
        stream = _Body(self, conn, request, buf, conn.last_read_ns, framing, length, keep, timeout)
        return httpx.Response(status, headers=headers, stream=stream,
                              extensions={"http_version": parts[0],
                                          "reason_phrase": parts[2] if len(parts) > 2
                                          else b"", "network_stream": conn})

    def _release(self, conn: Connection) -> None:
        """An in-use connection whose response was read to the end goes back to the pool."""
        if self._slots is not None:
            self._slots.release()
        if conn.usable():
            conn.idle_since = time.monotonic()
            self._idle.setdefault(conn.origin, []).append(conn)
        else:
            self._all.discard(conn)
            conn.close()

    def _discard(self, conn: Connection) -> None:
        """An in-use connection that cannot be reused (error, unread body) is closed."""
        if self._slots is not None:
            self._slots.release()
        self._all.discard(conn)
        conn.close()

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()


def make_client(base_url: str, *, limit: int | None, timeout: httpx.Timeout,
                headers: Mapping[str, str] | None = None, stamped: bool = True) -> httpx.AsyncClient:
    """An httpx client for load: no env proxies, no retries; socket-stamped HTTP/1.1 by default.

    ``stamped=False`` uses httpx's stock transport (httpcore + h11): the stamp is then taken when a
    chunk reaches our code, and parsing costs several times more CPU per token.
    """
    transport: httpx.AsyncBaseTransport
    if stamped:
        transport = _H1Transport(max_connections=limit)
    else:
        limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit,
                              keepalive_expiry=REUSE_IDLE_S)
        transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
    hdrs = {"content-type": "application/json", "accept": "text/event-stream"}
    hdrs.update(headers or {})
    return httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout, headers=hdrs,
                             trust_env=False, follow_redirects=False)
