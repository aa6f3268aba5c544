"""A synthetic OpenAI/SGLang-shaped streaming server whose timing is set exactly.

It exists to measure *clients* (our load generator, GuideLLM, AIPerf), so it must never be the
bottleneck and it must know the truth:

* raw ``asyncio.Protocol`` HTTP/1.1 (keep-alive, chunked transfer), no framework;
* every SSE event that does not depend on the request is encoded once, at start-up;
* the first token goes out ``--ttft-ms`` after the request was fully read, token ``i`` at the
  absolute deadline ``t_first + i * itl`` (``loop.call_at``; a late wake-up never drifts the
  schedule); ``--itl-ms 0`` writes the rest of the stream in one ``write``;
* it records what it actually did (``GET /stats``): TTFT from "request fully read" to "first
  token handed to the kernel", the gaps between token writes, and tokens per second over the
  active window (first request read .. last token written).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (stream and non-stream; the
stream ends with a usage chunk ``choices: []`` and ``data: [DONE]``), ``POST /generate`` (SGLang
native, cumulative ``text``/``output_ids``, ``meta_info`` with ``completion_tokens`` and, on the
last event, ``spec_verify_ct``/``spec_accept_length``), ``GET /v1/models``, ``GET /health``,
``GET /server_info`` (``internal_states[0].avg_spec_accept_length``, cumulative since the last
``POST /flush_cache``), ``GET /stats`` (``/stats/raw``: every TTFT in
arrival order), ``POST /stats/reset[?skip=N]`` (the next N generation requests
are served but not recorded: a client's warm-up), ``GET /counters``, ``GET /prompts`` (with
``--record-prompts``: the prompt text of every generation request, in arrival order, for tests that check
what a client sent).

Faults for the client's error-path tests (``--fault MODE --fault-every N``: every N-th request,
counting from the first, gets the fault): ``http500``, ``drop_before`` (close without an answer),
``drop`` (close after the first token), ``garbage`` (a non-JSON ``data:`` event), ``truncate``
(end the stream without usage and ``[DONE]``), ``stall`` (first token, then silence),
``no_usage`` (no usage chunk), ``error_event`` (an in-stream ``{"error": …}`` event).

Usage::

    python -m pytest_dflash.refserver.synthetic --port 0 --tokens 128 --ttft-ms 50 --itl-ms 10

prints ``LISTENING <port>`` on stdout once the socket listens. Binds loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import ipaddress
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_dflash.refserver.synthetic_events import (
    DONE_CHUNK,
    END_CHUNK,
    SSE_HEADERS,
    TOKEN_ID,
    TOKEN_TEXT,
    Config,
    Encoded,
    Stats,
    chunk,
    count_prompt_tokens,
    dumps,
    json_response,
    prompt_text,
)

FAULTS = ("http500", "drop_before", "drop", "garbage", "truncate", "stall", "no_usage", "error_event")
MAX_RECORDS = 2_000_000


class Server:
    """Shared state: configuration, pre-encoded events, statistics, accept-length counters."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.stats = Stats()
        self._encoded: dict[tuple[str, int], Encoded] = {}
        self.request_index = 0
        self.tokens_total = 0  # every token written, recorded or not (GET /counters)
        self.spec_tokens = 0
        self.spec_verify = 0
        # --record-prompts: every generation request's prompt text (GET /prompts)
        self.prompts: list[str] = []
        self.connections: set[Conn] = set()

    def encoded(self, endpoint: str, n: int) -> Encoded:
        key = (endpoint, n)
        enc = self._encoded.get(key)
        if enc is None:
            enc = self._encoded[key] = Encoded(endpoint, n, self.cfg)
        return enc


class Conn(asyncio.Protocol):
    """One client connection: parses requests, streams responses on a timer schedule."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._process()

    # -- request parsing --------------------------------------------------------------------------
    def _process(self) -> None:
        while not self.busy and not self.closed:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            try:
                method, target, _version = head[0].split(" ", 2)
            except ValueError:
                self._send(json_response(400, {"error": "bad request line"}, keep_alive=False))
                self._close()
                return
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            t_read = time.perf_counter_ns()
            keep_alive = headers.get("connection", "").lower() != "close"
            path, _, qs = target.partition("?")
            query = dict(kv.partition("=")[::2] for kv in qs.split("&") if kv)
            self._route(method, path, query, body, t_read, keep_alive)

    def _route(self, method: str, path: str, query: dict[str, str], body: bytes, t_read: int,
               keep_alive: bool) -> None:
        srv = self.server
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions", "/generate"):
            endpoint = {"/v1/chat/completions": "chat",
                        "/v1/completions": "completions"}.get(path, "generate")
            try:
                req = json.loads(body) if body else {}
                if not isinstance(req, dict):
                    raise ValueError("body is not an object")
            except ValueError as exc:
                self._send(json_response(400,
                                         {"object": "error", "message": f"bad JSON: {exc}", "code": 400}))
                return
            self._generation(endpoint, req, t_read, keep_alive)
            return
        if method == "GET" and path in ("/health", "/health_generate"):
            self._send(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nserver: synth\r\n\r\n")
        elif method == "GET" and path == "/v1/models":
            self._send(json_response(200, {"object": "list", "data": [
                {"id": srv.cfg.model, "object": "model", "owned_by": "synth", "max_model_len": 1 << 20}]}))
        elif method == "GET" and path in ("/server_info", "/get_server_info"):
            avg = srv.spec_tokens / srv.spec_verify if srv.spec_verify else None
            self._send(json_response(200, {"version": "synth", "internal_states": [
                {"avg_spec_accept_length": avg}]}))
        elif method == "POST" and path == "/flush_cache":
            srv.spec_tokens = srv.spec_verify = 0
            self._send(json_response(200, b"Cache flushed.\n"))
        elif method == "GET" and path == "/stats":
            self._send(json_response(200, srv.stats.summary()))
        elif method == "GET" and path == "/stats/raw":
            self._send(json_response(200, {"ttft_ms": [v / 1e6 for v in srv.stats.ttft_ns]}))
        elif method == "POST" and path == "/stats/reset":
            srv.stats = Stats(skip=int(query.get("skip", "0")))
            self._send(json_response(200, {"ok": True}))
        elif method == "GET" and path == "/prompts":
            self._send(json_response(200, {"recorded": srv.cfg.record_prompts, "prompts": srv.prompts}))
        elif method == "GET" and path == "/counters":
            self._send(json_response(200, {"requests": srv.request_index, "tokens": srv.tokens_total}))
        else:
            self._send(json_response(404, {"detail": "Not Found"}))
        if not keep_alive:
            self._close()

    # -- generation -------------------------------------------------------------------------------
    def _generation(self, endpoint: str, req: dict[str, Any], t_read: int, keep_alive: bool) -> None:
        srv, cfg = self.server, self.server.cfg
        index = srv.request_index
        srv.request_index += 1
        if cfg.record_prompts and len(srv.prompts) < 1_000_000:
            srv.prompts.append(prompt_text(endpoint, req))
        stats = srv.stats
        if stats.skip > 0:  # served, but recorded in a throw-away Stats
            stats.skip -= 1
            stats = Stats()
        stats.requests += 1
        if stats.t_first_request_ns == 0:
            stats.t_first_request_ns = t_read
        fault = cfg.fault if cfg.fault and index % cfg.fault_every == 0 else None
        if fault:
            stats.faults += 1
        n = cfg.tokens
        if cfg.honor_max_tokens:
            params = req.get("sampling_params", {}) if endpoint == "generate" else req
            asked = params.get("max_new_tokens" if endpoint == "generate" else "max_tokens")
            if isinstance(asked, int) and asked > 0:
                n = min(n, asked) if cfg.tokens > 0 else asked
        prompt_tokens = count_prompt_tokens(endpoint, req)
        if fault == "http500":
            self._send(json_response(500, {"object": "error", "message": "synthetic failure", "code": 500}))
            return
        if fault == "drop_before":
            self._close()
            return
        stream = bool(req.get("stream", False))
        enc = srv.encoded(endpoint, n)
        if not stream:
            self._non_stream(endpoint, n, prompt_tokens, enc, t_read, keep_alive, stats)
            return
        self.busy = True
        self._send(SSE_HEADERS)
        tail = enc.usage_chunk(endpoint, cfg.model, prompt_tokens, n)
        if endpoint == "generate":
            srv.spec_tokens += n
            srv.spec_verify += len(enc.event_tokens)
        if fault in ("truncate", "no_usage"):
            tail = b""
        elif fault == "error_event":
            tail = chunk(dumps({"error": {"message": "synthetic in-stream error", "code": 500}}))
        done = b"" if fault == "truncate" else DONE_CHUNK
        first, rest = enc.first, enc.rest
        if endpoint == "generate":  # prompt_tokens differs per request: frame these per request
            framed = [chunk(p.replace(b'"@P@"', b"%d" % prompt_tokens)) for p in enc.raw]
            first, rest = framed[0], framed[1:]
        ttft_s = cfg.ttft_ms / 1e3
        itl_s = cfg.itl_ms / 1e3
        t0 = self.loop.time()
        state = _Stream(stats=stats, first=first, rest=rest, tail=tail + done + END_CHUNK, fault=fault,
                        event_tokens=enc.event_tokens, t_read=t_read, keep_alive=keep_alive,
                        base=t0 + ttft_s, itl_s=itl_s)
        if ttft_s <= 0:
            self._emit(state)
        else:
            self.timer = self.loop.call_at(state.base, self._emit, state)

    def _non_stream(self, endpoint: str, n: int, prompt_tokens: int, enc: Encoded, t_read: int,
                    keep_alive: bool, stats: Stats) -> None:
        cfg = self.server.cfg
        text = TOKEN_TEXT * n
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        if endpoint == "generate":
            obj: dict[str, Any] = {"text": text, "output_ids": [TOKEN_ID] * n, "meta_info": {
                "id": "synth", "finish_reason": {"type": "length", "length": n},
                "prompt_tokens": prompt_tokens, "completion_tokens": n,
                "spec_verify_ct": len(enc.event_tokens), "spec_accept_length": n / len(enc.event_tokens)}}
            self.server.spec_tokens += n
            self.server.spec_verify += len(enc.event_tokens)
        elif endpoint == "chat":
            obj = {"id": "synth", "object": "chat.completion", "created": 0, "model": cfg.model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                "finish_reason": "length"}], "usage": usage}
        else:
            obj = {"id": "synth", "object": "text_completion", "created": 0, "model": cfg.model,
                   "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage}

        def answer() -> None:
            self.timer = None
            if self.closed:
                return
            now = time.perf_counter_ns()
            self._send(json_response(200, obj, keep_alive=keep_alive))
            stats.ttft_ns.append(now - t_read) if len(stats.ttft_ns) < MAX_RECORDS else None
            stats.tokens += n
            self.server.tokens_total += n
            stats.t_last_token_ns = now
            if not keep_alive:
                self._close()

        delay = (cfg.ttft_ms + max(n - 1, 0) * cfg.itl_ms) / 1e3
        if delay <= 0:
            answer()
        else:
            self.timer = self.loop.call_later(delay, answer)

    def _emit(self, st: _Stream) -> None:
        """Write the next event(s) and schedule the one after on its absolute deadline."""
        self.timer = None
        if self.closed:
            return
        stats = st.stats
        now = time.perf_counter_ns()
        if st.sent == 0:
            self._send(st.first)
            if len(stats.ttft_ns) < MAX_RECORDS:
                stats.ttft_ns.append(now - st.t_read)
            stats.tokens += st.event_tokens[0]
            self.server.tokens_total += st.event_tokens[0]
            st.sent = 1
            st.last_ns = now
            if st.fault == "stall":
                return
            if st.fault == "drop":
                self._close(abort=True)
                return
            if st.fault == "garbage":
                self._send(chunk(b"this is not json {"))
            if st.itl_s <= 0 or not st.rest:
                self._send(b"".join(st.rest) + st.tail)
                stats.tokens += sum(st.event_tokens[1:])
                self.server.tokens_total += sum(st.event_tokens[1:])
                stats.t_last_token_ns = time.perf_counter_ns()
                self._finish(st)
                return
        else:
            last = st.sent == len(st.rest)
            payload = st.rest[st.sent - 1]
            self._send(payload + st.tail if last else payload)
            if len(stats.itl_ns) < MAX_RECORDS:
                stats.itl_ns.append(now - st.last_ns)
            st.last_ns = now
            stats.tokens += st.event_tokens[st.sent]
            self.server.tokens_total += st.event_tokens[st.sent]
            st.sent += 1
            if last:
                stats.t_last_token_ns = now
                self._finish(st)
                return
        self.timer = self.loop.call_at(st.base + st.sent * st.itl_s, self._emit, st)

    def _finish(self, st: _Stream) -> None:
        self.busy = False
        if not st.keep_alive:
            self._close()
        elif self.buf:
            self._process()

    # -- output -----------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _close(self, *, abort: bool = False) -> None:
        if self.transport is not None and not self.closed:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()
        self.closed = True


@dataclass
class _Stream:
    stats: Stats
    first: bytes
    rest: list[bytes]
    tail: bytes
    fault: str | None
    event_tokens: list[int]
    t_read: int
    keep_alive: bool
    base: float
    itl_s: float
    sent: int = 0
    last_ns: int = 0


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    if not ipaddress.ip_address(host).is_loopback:
        raise SystemExit(f"synth_server binds loopback only, not {host!r}")


async def serve(cfg: Config, host: str = "127.0.0.1", port: int = 0,
                on_listening: Callable[[int], None] | None = None, reuse_port: bool = False) -> None:
    """Serve until cancelled (or SIGTERM/SIGINT when run as a script). With `reuse_port`, other processes may
    bind the same port (SO_REUSEPORT: the kernel spreads connections over them), so a client benchmark can
    run several server processes behind one URL; each keeps its own /stats."""
    _check_loopback(host)
    loop = asyncio.get_running_loop()
    server = Server(cfg)
    srv = await loop.create_server(lambda: Conn(server), host, port, backlog=1024, reuse_address=True,
                                   reuse_port=reuse_port)
    bound = srv.sockets[0].getsockname()[1]
    if on_listening is not None:
        on_listening(bound)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        srv.close()
        for conn in list(server.connections):
            conn._close(abort=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per response")
    ap.add_argument("--honor-max-tokens", action="store_true", help="cap by the request's max_tokens")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--model", default="synth-model")
    ap.add_argument("--tokens-per-event", default="1", help="/generate: comma list, cycled per event")
    ap.add_argument("--fault", choices=FAULTS, default=None)
    ap.add_argument("--fault-every", type=int, default=1)
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    ap.add_argument("--record-prompts", action="store_true", help="keep every prompt for GET /prompts")
    ap.add_argument("--reuse-port", action="store_true",
                    help="SO_REUSEPORT: several server processes on one port (each its own /stats)")
    a = ap.parse_args(argv)
    cfg = Config(tokens=a.tokens, honor_max_tokens=a.honor_max_tokens, ttft_ms=a.ttft_ms, itl_ms=a.itl_ms,
                 model=a.model, tokens_per_event=tuple(int(x) for x in a.tokens_per_event.split(",")),
                 fault=a.fault, fault_every=max(1, a.fault_every), record_prompts=a.record_prompts)

    def listening(port: int) -> None:
        print(f"LISTENING {port}", flush=True)

    if a.loop == "uvloop":
        importlib.import_module("uvloop").run(serve(cfg, a.host, a.port, listening, a.reuse_port))  # optional
    else:
        asyncio.run(serve(cfg, a.host, a.port, listening, a.reuse_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
