"""A real HTTP server (stdlib, its own process) whose generations fail with HTTP 500.

`python last_words_server.py PORT [DIE_AFTER_S]`: GET /v1/models answers 200 like SGLang's; POST /generate
and /v1/completions answer 500 "Internal Server Error" — uvicorn's answer when an app fails while its event
loop shuts down. With DIE_AFTER_S the process then exits 1 that many seconds after the first 500 (a server's
last words); without, it stays up (a server that is merely broken).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def main() -> None:
    port = int(sys.argv[1])
    die_after = float(sys.argv[2]) if len(sys.argv) > 2 else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            print(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}", flush=True)

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode(),
                           "application/json")
            else:
                self._send(404, b'{"detail":"Not Found"}', "application/json")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            if die_after is not None:
                print("ERROR:    Exception in ASGI application (the event loop is shutting down)", flush=True)
                threading.Thread(target=exit_in, args=(die_after,), daemon=True).start()

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


def exit_in(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(1)


if __name__ == "__main__":
    main()
