"""Real HTTP servers on 127.0.0.1 that misbehave where the refserver has no fault for it.

`FaultProxy` forwards every request to a real server (a refserver process) and lets a rule replace
the answer to some of them: an HTTP 500 to sampled requests, megabytes for max_tokens=4.
`SilentServer` listens and never answers (the kernel accepts the connection from its backlog).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

# httpx imports httpcore lazily, on its first transport. Do it now: pytester's teardown drops the modules first
# imported during a test, and a second copy of httpcore raises exceptions that httpx no longer maps.
httpx.HTTPTransport().close()

__all__ = ["FaultProxy", "Reply", "SilentServer", "huge_generation", "is_sampled", "sampled_500"]


@dataclass
class Reply:
    """What the proxy answers instead of the upstream server."""

    status: int
    body: bytes
    content_type: str = "application/json"
    chunked: bool = False  # no Content-Length: the client only learns the size by reading


Rule = Callable[[str, str, Any], Reply | None]  # (method, path, JSON body or None) -> replacement


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

        self._http = httpx.Client(base_url=self.upstream, timeout=httpx.Timeout(120.0, connect=5.0))
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
