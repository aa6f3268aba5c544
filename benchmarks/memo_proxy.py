"""A memoizing HTTP proxy in front of one refserver: each distinct reproducible generation is computed once.

fleet_scale.py points every host of its fleet at the same two servers, so the fleet sends the same requests
N times (same prompts, same seeds). On the 2-core runner the refserver's real CPU generations then dominate
the wall time, and the benchmark measures the server instead of the plugin. This proxy answers a repeat of a
*reproducible* generation request — greedy (temperature 0, or no sampling at all) or carrying a seed — with
the bytes the refserver sent the first time (status, content type and body; a stream is answered as one
body, which an SSE client reads the same way). Everything else passes through to the refserver untouched:
unseeded sampled requests (their answers must differ), /server_info, /flush_cache, /metrics, /v1/models,
/health — so what the plugin checks is still a real server's answer.

    python benchmarks/memo_proxy.py --upstream http://127.0.0.1:PORT [--port 0]

prints ``LISTENING <port>`` once it listens; ``GET /memo_stats`` (answered by the proxy) says how many
requests were served from memory and how many went upstream. Binds loopback only; stdlib only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


def reproducible(body: bytes) -> bool:
    """A request whose answer a correct server repeats: greedy, or every sampled item carries a seed."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    params = data.get("sampling_params", data)  # native /generate nests them; OpenAI puts them top level
    items = params if isinstance(params, list) else [params]
    for item in items:
        if not isinstance(item, dict):
            return False
        temperature = item.get("temperature", 1.0)  # SGLang's and OpenAI's default both sample
        if temperature and item.get("seed", item.get("sampling_seed")) is None:
            return False
    return True


class MemoProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, upstream: str) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.memory: dict[tuple[str, bytes], tuple[int, list[tuple[str, str]], bytes]] = {}
        self.lock = threading.Lock()
        self.hits = self.misses = self.passed = 0
        self.local = threading.local()

    def forward(self, method: str, path: str, headers: list[tuple[str, str]],
                body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn: http.client.HTTPConnection | None = getattr(self.local, "conn", None)
        for attempt in range(2):  # a kept-alive upstream connection may have been closed: one fresh retry
            if conn is None:
                conn = http.client.HTTPConnection(*self.upstream, timeout=600)
                self.local.conn = conn
            try:
                conn.request(method, path, body=body or None, headers=dict(headers))
                response = conn.getresponse()
                data = response.read()
                kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_HEADERS]
                return response.status, kept, data
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                conn = self.local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: MemoProxy

    def log_message(self, format: str, *args: Any) -> None:  # quiet: a line per request is noise
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        # Head and body in one write: two small writes meet the client's delayed ACK (40 ms per answer).
        self.send_response_only(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self._headers_buffer.append(b"\r\n")
        self.wfile.write(b"".join(self._headers_buffer) + body)
        self._headers_buffer = []

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        proxy = self.server
        if self.path == "/memo_stats":
            stats = {"hits": proxy.hits, "misses": proxy.misses, "passed": proxy.passed,
                     "kept": len(proxy.memory)}
            self._answer(200, [("Content-Type", "application/json")], json.dumps(stats).encode())
            return
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_HEADERS | {"host"}]
        key = (self.path, body)
        memo = self.command == "POST" and self.path.split("?")[0] in GENERATION_PATHS and reproducible(body)
        if memo:
            with proxy.lock:
                kept = proxy.memory.get(key)
                proxy.hits += kept is not None
            if kept is not None:
                self._answer(*kept)
                return
        try:
            answer = proxy.forward(self.command, self.path, headers, body)
        except (OSError, http.client.HTTPException) as exc:
            self._answer(502, [("Content-Type", "text/plain")],
                         f"memo_proxy: upstream failed: {exc}".encode())
            return
        with proxy.lock:
            if memo and answer[0] == 200:
                proxy.memory[key] = answer
                proxy.misses += 1
            else:
                proxy.passed += 1
        self._answer(*answer)

    do_GET = do_POST = do_PUT = do_DELETE = _handle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the refserver's URL, http://127.0.0.1:PORT")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = MemoProxy(args.port, args.upstream)
    print(f"LISTENING {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
