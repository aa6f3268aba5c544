"""Real HTTP servers on 127.0.0.1 that misbehave where the refserver has no fault for it.

`FaultProxy` forwards every request to a real server (a refserver process) and lets a rule replace
the answer to some of them: an HTTP 500 to sampled requests, megabytes for max_tokens=4.
`SilentServer` listens and never answers (the kernel accepts the connection from its backlog).
`StallServer` answers some paths late and holds every other request open, never answered.
`DripServer` answers a byte, a blank line or a token at a time: no read waits long, no answer ends.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer as _StdlibThreadingHTTPServer
from typing import Any

import httpx


class ThreadingHTTPServer(_StdlibThreadingHTTPServer):
    """The stdlib's, with uvicorn's listen backlog (2048) instead of 5: the checks open 16 connections at once
    (sampling_varies_with_seed). CI read a reset from the proxy during those 16 on a loaded machine; a full
    backlog of 5 is the likeliest cause (the proxy's upstream connections are fresh since 2609f6d)."""

    request_queue_size = 2048


# httpx imports httpcore lazily, on its first transport. Do it now: pytester's teardown drops the modules first
# imported during a test, and a second copy of httpcore raises exceptions that httpx no longer maps.
httpx.HTTPTransport().close()

__all__ = ["DripServer", "FaultProxy", "FlakyRoute", "Reply", "SilentServer", "StallServer", "blank_stream", "huge_generation",
           "is_sampled", "sampled_500"]


@dataclass
class Reply:
    """What the proxy answers instead of the upstream server."""

    status: int
    body: bytes
    content_type: str = "application/json"
    chunked: bool = False  # no Content-Length: the client only learns the size by reading
    drip_every_s: float | None = None  # chunked, `body` sent again every this many seconds (for drip_for_s)
    drip_for_s: float = 60.0


Rule = Callable[[str, str, Any], Reply | None]  # (method, path, JSON body or None) -> replacement


@dataclass
class FlakyRoute:
    """A rule: HTTP `status` to the first `times` GETs of `paths` once `after_generations` POST /generate have
    gone by (2: after an attached server's readiness, its greedy and sampled generation), then the upstream's
    answers; `times` None: every such GET, for good (a gateway that does not route the path)."""

    paths: tuple[str, ...] = ("/server_info", "/get_server_info")
    status: int = 503
    times: int | None = 2
    after_generations: int = 0
    generations: int = 0
    replaced: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, method: str, path: str, body: Any) -> Reply | None:
        with self._lock:
            if method == "POST" and path == "/generate":
                self.generations += 1
                return None
            if (method == "GET" and path.split("?")[0] in self.paths and self.generations >= self.after_generations
                    and (self.times is None or self.replaced < self.times)):
                self.replaced += 1
                return Reply(self.status, json.dumps({"error": f"HTTP {self.status} from the proxy"}).encode())
        return None


@dataclass
class FaultProxy:
    """A reverse proxy on 127.0.0.1:<free port> in front of `upstream`; `rule` may replace answers."""

    upstream: str
    rule: Rule
    replaced: list[str] = field(default_factory=list)  # "METHOD /path" of each replaced answer

    def __post_init__(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests read outcomes, not access lines."""

            def do_GET(self) -> None:
                proxy._handle(self)

            def do_POST(self) -> None:
                proxy._handle(self)

        # A fresh upstream connection per request, as nginx proxies by default: a pooled one could meet the
        # refserver's 5 s keep-alive close and turn a healthy upstream into a dropped answer.
        self._http = httpx.Client(base_url=self.upstream, timeout=httpx.Timeout(120.0, connect=5.0),
                                  limits=httpx.Limits(max_keepalive_connections=0))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._http.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = None
        reply = self.rule(handler.command, handler.path, body)
        if reply is not None:
            self.replaced.append(f"{handler.command} {handler.path}")
            _send(handler, reply)
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "content-length")}
        try:
            with self._http.stream(handler.command, handler.path, content=raw, headers=headers) as upstream:
                handler.send_response(upstream.status_code)
                for key, value in upstream.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        handler.send_header(key, value)
                handler.send_header("Transfer-Encoding", "chunked")
                handler.end_headers()
                for chunk in upstream.iter_raw():
                    _chunk(handler, chunk)
                _chunk(handler, b"")
        except httpx.HTTPError:
            handler.close_connection = True  # the upstream went away: so does this answer


def _chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def _send(handler: BaseHTTPRequestHandler, reply: Reply) -> None:
    handler.send_response(reply.status)
    handler.send_header("Content-Type", reply.content_type)
    if reply.drip_every_s is not None:
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        until = time.monotonic() + reply.drip_for_s
        try:
            while time.monotonic() < until:
                _chunk(handler, reply.body)
                time.sleep(reply.drip_every_s)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what a deadline does
        handler.close_connection = True
        return
    if not reply.chunked:
        handler.send_header("Content-Length", str(len(reply.body)))
        handler.end_headers()
        handler.wfile.write(reply.body)
        return
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for start in range(0, len(reply.body), 64 * 1024):
        try:
            _chunk(handler, reply.body[start:start + 64 * 1024])
        except (BrokenPipeError, ConnectionResetError):
            return  # the client stopped reading: what a byte cap does
    _chunk(handler, b"")


def blank_stream(every_s: float) -> Rule:
    """Answer every streamed generation with an SSE stream that sends a blank line every `every_s`, forever."""
    def rule(method: str, path: str, body: Any) -> Reply | None:
        if path not in ("/generate", "/v1/completions", "/v1/chat/completions") or not isinstance(body, dict):
            return None
        if not body.get("stream"):
            return None
        return Reply(200, b"\n", content_type="text/event-stream", drip_every_s=every_s)
    return rule


def is_sampled(path: str, body: Any) -> bool:
    """A generation request that goes through FlashInfer's top-k/top-p sampling kernel on SGLang."""
    if path not in ("/generate", "/v1/completions", "/v1/chat/completions") or not isinstance(body, dict):
        return False
    params = body.get("sampling_params", body)
    params = params[0] if isinstance(params, list) and params else params
    if not isinstance(params, dict) or float(params.get("temperature", 1.0)) <= 0:
        return False
    return int(params.get("top_k", -1)) > 1 or float(params.get("top_p", 1.0)) < 1


def sampled_500(method: str, path: str, body: Any) -> Reply | None:
    """SGLang's shape of an internal error, for every sampled generation."""
    if not is_sampled(path, body):
        return None
    return Reply(500, json.dumps({"object": "error", "message": "Internal server error", "type":
                                  "InternalServerError", "param": None, "code": 500}).encode())


def huge_generation(size: int, *, chunked: bool) -> Rule:
    """Answer every generation with a `size`-byte JSON body (a text that never ends)."""
    def rule(method: str, path: str, body: Any) -> Reply | None:
        if path not in ("/generate", "/v1/completions", "/v1/chat/completions"):
            return None
        head = b'{"text": "'
        tail = b'", "output_ids": [], "meta_info": {"finish_reason": {"type": "length"}}}'
        return Reply(200, head + b"x" * max(0, size - len(head) - len(tail)) + tail, chunked=chunked)
    return rule


class SilentServer:
    """Listens on 127.0.0.1:<free port> and never answers: connections complete from the backlog."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StallServer:
    """Answers each path of `answers` ({path: (status, after_s)}) with that status after that many seconds, and
    holds every other request open, never answered, until closed: a gateway that accepts a route and forwards it
    nowhere. `requests` lists the paths asked, in order."""

    def __init__(self, answers: dict[str, tuple[int, float]]) -> None:
        self.answers = answers
        self.requests: list[str] = []
        self._closed = threading.Event()
        stall = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests read outcomes, not access lines."""

            def do_GET(self) -> None:
                stall._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="stall-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path.split("?")[0]
        self.requests.append(path)
        handler.close_connection = True
        if path not in self.answers:
            self._closed.wait()  # accepted, never answered
            return
        status, after_s = self.answers[path]
        if self._closed.wait(after_s):
            return
        with contextlib.suppress(OSError):  # the client may have given up meanwhile
            _send(handler, Reply(status, json.dumps({"detail": f"HTTP {status} after {after_s:g}s"}).encode()))

    def close(self) -> None:
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> StallServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DripServer:
    """Answers every request on 127.0.0.1:<free port> a little at a time, so that no single read ever waits long
    (per-read timeouts never fire) while the answer never completes — for `for_s` seconds, then it hangs up.

    `mode`: "headers" drips the status line and headers one byte per `every_s`; "body" sends the headers of a
    200 with a large Content-Length, then one body byte per `every_s`; "sse" sends the headers of an SSE
    stream, then `line` (a blank line by default; ": ping\\n\\n" is an SSE comment) per `every_s`; "tokens"
    sends one native /generate SSE event with one more output id per `every_s`, never [DONE].
    `paths`: only these paths drip; others answer `{}` with 200 at once (None: every path drips).
    """

    def __init__(self, mode: str, *, every_s: float = 0.2, for_s: float = 20.0, line: bytes = b"\n",
                 paths: tuple[str, ...] | None = None) -> None:
        self.mode, self.every_s, self.for_s, self.line, self.paths = mode, every_s, for_s, line, paths
        self.requests: list[str] = []
        self._closed = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, name="drip-server", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="drip-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                while True:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        data = conn.recv(65536)
                        if not data:
                            return
                        head += data
                    request_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
                    self.requests.append(request_line)
                    length = 0
                    for header in head.split(b"\r\n"):
                        if header.lower().startswith(b"content-length:"):
                            length = int(header.split(b":", 1)[1])
                    body = head.split(b"\r\n\r\n", 1)[1]
                    while len(body) < length:
                        body += conn.recv(65536)
                    path = request_line.split(" ")[1] if " " in request_line else "/"
                    if self.paths is not None and path.split("?")[0] not in self.paths:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                        continue
                    self._drip(conn)
                    return
            except OSError:
                return

    def _drip(self, conn: socket.socket) -> None:
        until = time.monotonic() + self.for_s
        if self.mode == "headers":
            pieces = [bytes([b]) for b in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" * 1000]
        elif self.mode == "body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{")
            pieces = [b" "] * 60000
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            pieces = []
        ids: list[int] = []
        index = 0
        while time.monotonic() < until and not self._closed.is_set():
            if self.mode in ("headers", "body"):
                piece = pieces[index % len(pieces)]
            elif self.mode == "sse":
                piece = _chunk_bytes(self.line)
            else:
                ids.append(100 + index)
                event = {"text": "x" * len(ids), "output_ids": list(ids), "meta_info": {"completion_tokens": len(ids)}}
                piece = _chunk_bytes(b"data: " + json.dumps(event).encode() + b"\n\n")
            index += 1
            conn.sendall(piece)
            time.sleep(self.every_s)

    def close(self) -> None:
        self._closed.set()
        self._sock.close()

    def __enter__(self) -> DripServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunk_bytes(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "response_format")


def _constrained(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    params = body.get("sampling_params") if isinstance(body.get("sampling_params"), dict) else {}
    return any(field in body or field in params for field in GRAMMAR_FIELDS)


def grammar_ignored(upstream: str) -> Rule:
    """A server that accepts a constrained request and ignores its grammar: the request is sent on without its
    json_schema / regex / ebnf / response_format, and the unconstrained answer (200) comes back."""
    def rule(method: str, path: str, body: Any) -> Reply | None:
        if method != "POST" or not _constrained(body):
            return None
        stripped = {k: v for k, v in body.items() if k not in GRAMMAR_FIELDS}
        if isinstance(body.get("sampling_params"), dict):
            stripped["sampling_params"] = {k: v for k, v in body["sampling_params"].items()
                                           if k not in GRAMMAR_FIELDS}
        answer = httpx.post(upstream + path, json=stripped, timeout=60.0)
        return Reply(answer.status_code, answer.content,
                     content_type=answer.headers.get("content-type", "application/json"))
    return rule


def grammar_500(method: str, path: str, body: Any) -> Reply | None:
    """SGLang's shape of an internal error, for every constrained request (a grammar backend that crashes)."""
    if method != "POST" or not _constrained(body):
        return None
    return Reply(500, json.dumps({"object": "error", "message": "Internal server error", "type":
                                  "InternalServerError", "param": None, "code": 500}).encode())
