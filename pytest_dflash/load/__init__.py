"""Load generator for OpenAI-compatible and SGLang-native streaming endpoints (httpx, asyncio).

One call, :func:`run_load` (or :func:`run_load_async`), drives a server with a :class:`LoadSpec`
and returns a :class:`LoadResult`: one :class:`RequestRecord` per request and aggregates named as
sglang ``bench_serving`` names them (``output_throughput``, ``mean_ttft_ms``, ``p99_itl_ms`` …).

What is measured, and where the clock is read
=============================================
* **Time stamps are taken at the socket.** The httpx client runs on an httpx transport of our own
  (:class:`.transport._H1Transport`: HTTP/1.1 keep-alive on asyncio protocols) whose protocol reads
  ``time.perf_counter_ns()`` inside ``data_received`` — the moment the bytes reach user space —
  and hands that stamp out with the bytes of each read. So a busy parser cannot make a token look
  later than it arrived. It also de-chunks a response per read instead of per chunk, which is
  what makes the client cheap (see benchmarks/README.md).
* **TTFT** = arrival of the first *token event* − the moment the request (head and body, one
  ``write``) was handed to the kernel, after any connection set-up; ``send_delay_ms`` records pool
  wait + connect + httpx overhead before that. A token event is an SSE event that carries a token: chat
  ``delta.content``/``delta.reasoning_content`` present as a string (SGLang's first chunk carries
  the role and ``content: ""`` when the first token is out), completions ``choices[0].text`` a
  string, ``/generate`` an event whose ``meta_info.completion_tokens`` grew.
* **ITL** = gaps between consecutive token events (per SSE event; on ``/generate`` with speculative
  decoding one event may carry several tokens — ``event_tokens`` keeps the count, bench_serving
  would split the gap evenly). **TPOT** = (e2e − TTFT) / (output_tokens − 1). **e2e** = end of the
  stream (``[DONE]``) − request start.
* **Output tokens** come from the server: the usage chunk (``stream_options.include_usage``) on
  OpenAI endpoints, ``meta_info.completion_tokens`` on ``/generate`` — never from chunk counts. A
  stream without them is an error (``missing_usage``), not a guess.
* **Errors** are typed (:class:`ErrorKind`): HTTP status (with a body excerpt), connect failure,
  connection dropped, timeout, malformed SSE/JSON, stream ended without ``[DONE]``, an in-stream
  ``{"error": …}`` event, no token at all, missing usage, cancelled by the run deadline.
* **Nothing hangs**: connect/read/write/pool timeouts on every HTTP call, a total deadline per
  request (``request_timeout_s``), and a deadline for the whole run (``run_timeout_s``) after which
  in-flight requests are cancelled and recorded as ``cancelled``.
* **Self-awareness**: a ticker task measures event-loop lag, and the loop thread's CPU time is
  read around the run; when the client itself is the bottleneck ``LoadResult.client_saturated``
  is True with the reason, and a perf layer must not judge floors on that run.

Parsing does not ``json.loads`` every event: token events are recognised by byte patterns that
cannot occur inside a JSON string (quotes inside strings are escaped), and the events that carry
the facts (usage, the final ``/generate`` meta_info, error events) are decoded in full. Every event
is still checked to be a ``{…}`` object; ``LoadSpec.strict_json=True`` decodes every event.

Where each part lives
=====================
:mod:`.spec` (:class:`LoadSpec`, lengths, SLOs) · :mod:`.workload` (request *i* → prompt and body) ·
:mod:`.transport` (the stamped HTTP/1.1 transport, :func:`make_client`) · :mod:`.sse` (one streamed
request: SSE framing and the token/usage consumers) · :mod:`.monitor` (event-loop lag, CPU,
saturation) · :mod:`.results` (records, :class:`LoadResult`, aggregates) · :mod:`.serverinfo` (server-side
accept length) · :mod:`.loop` (the run on one event loop) · :mod:`.procs` (one run over
``client_procs`` processes, merged) · :mod:`.run` (:func:`run_load`: one loop or the processes) ·
:mod:`.__main__` (the CLI).
"""

from __future__ import annotations

from pytest_dflash.load.loop import run_load_async
from pytest_dflash.load.results import (
    ErrorKind,
    LoadResult,
    RequestError,
    RequestRecord,
    Saturation,
    aggregate,
    tokens_over_time,
)
from pytest_dflash.load.run import run_load
from pytest_dflash.load.serverinfo import flush_cache, server_accept_length
from pytest_dflash.load.spec import LengthDist, LoadSpec, Slo
from pytest_dflash.load.transport import make_client

__all__ = [
    "ErrorKind",
    "LengthDist",
    "LoadResult",
    "LoadSpec",
    "RequestError",
    "RequestRecord",
    "Saturation",
    "Slo",
    "aggregate",
    "flush_cache",
    "make_client",
    "run_load",
    "run_load_async",
    "server_accept_length",
    "tokens_over_time",
]
