"""One streamed request: send it, read the SSE stream, fill its :class:`RequestRecord`.

Token events are recognised by byte patterns, and only the events that carry facts (usage, the
final ``/generate`` meta_info, errors) are decoded in full (see the package docstring). A failure is
raised inside as :class:`_Fail` and recorded as a typed :class:`RequestError`, never raised out."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx

from pytest_dflash.documents import loads_json
from pytest_dflash.load.results import ErrorKind, RequestError, RequestRecord
from pytest_dflash.load.transport import Connection

_NS = 1_000_000  # ns per ms


class _Fail(Exception):
    def __init__(self, kind: ErrorKind, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.error = RequestError(kind, message, status, body)


def _counted(tokens: int, rec: RequestRecord) -> int:
    """The completion tokens a server reports, refused when more than the request allowed: throughput is
    computed from them, so a server that over-counts (draft tokens counted as generated) would pass any
    throughput floor."""
    if rec.max_tokens and tokens > rec.max_tokens:
        raise _Fail(ErrorKind.MALFORMED, f"the server reports {tokens} completion tokens for a request of "
                                         f"at most {rec.max_tokens}: its token counts (and the throughput "
                                         "computed from them) cannot be trusted")
    return tokens


_CT_RE = re.compile(rb'"completion_tokens":\s*(\d+)')
_TOKEN_PATTERNS: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"content":"', b'"reasoning_content":"'),
    "completions": (b'"text":"',),
}


def _excerpt(data: bytes, limit: int = 300) -> str:
    return data[:limit].decode("utf-8", "replace")


def _split_event(block: bytes) -> bytes | None:
    """The data of one SSE event block (lines joined by \\n); None for comment/field-only blocks."""
    if block.startswith(b"data: ") and b"\n" not in block:
        return block[6:]
    parts: list[bytes] = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
        elif (line and not line.startswith(b":") and b":" not in line
              and line not in (b"event", b"id", b"retry")):
            raise _Fail(ErrorKind.MALFORMED, f"not an SSE line: {_excerpt(line, 120)!r}")
    if not parts:
        return None
    return b"\n".join(parts)


def _decode(payload: bytes) -> dict[str, Any]:
    try:
        obj = loads_json(payload)
    except ValueError as exc:  # JSONDecodeError, DocumentTooDeep
        raise _Fail(ErrorKind.MALFORMED, f"SSE data is not JSON ({exc})", body=_excerpt(payload)) from None
    if not isinstance(obj, dict):
        raise _Fail(ErrorKind.MALFORMED, "SSE data is not a JSON object", body=_excerpt(payload))
    return obj


def _error_message(obj: Mapping[str, Any]) -> str:
    err = obj.get("error")
    if isinstance(err, Mapping):
        return str(err.get("message", err))
    return str(err)


async def one_request(client: httpx.AsyncClient, path: str, endpoint: str, body: bytes,
                       rec: RequestRecord, t0_ns: int, strict: bool, keep_times: bool,
                       timeout_s: float) -> None:
    """Send one streamed request and fill ``rec``; never raises except CancelledError."""
    call_ns = time.perf_counter_ns()
    rec.start_s = (call_ns - t0_ns) / 1e9
    try:
        async with asyncio.timeout(timeout_s):
            await _stream(client, path, endpoint, body, rec, t0_ns, call_ns, strict, keep_times)
    except _Fail as f:
        rec.error = f.error
    except httpx.TimeoutException as exc:
        rec.error = RequestError(ErrorKind.TIMEOUT, f"{type(exc).__name__}: {exc}")
    except TimeoutError:
        rec.error = RequestError(ErrorKind.TIMEOUT, f"request_timeout_s ({timeout_s:g} s) reached")
    except httpx.ConnectError as exc:
        rec.error = RequestError(ErrorKind.CONNECT, str(exc) or type(exc).__name__)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        rec.error = RequestError(ErrorKind.DROPPED, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # one odd request must not end the run: it is recorded, typed "other"
        rec.error = RequestError(ErrorKind.OTHER, f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        rec.error = RequestError(ErrorKind.CANCELLED, "cancelled at the run deadline")
        rec.end_s = (time.perf_counter_ns() - t0_ns) / 1e9
        raise
    if rec.end_s is None:
        rec.end_s = (time.perf_counter_ns() - t0_ns) / 1e9


async def _stream(client: httpx.AsyncClient, path: str, endpoint: str, body: bytes, rec: RequestRecord,
                  t0_ns: int, call_ns: int, strict: bool, keep_times: bool) -> None:
    request = client.build_request("POST", path, content=body)
    resp = await client.send(request, stream=True)
    try:
        ns = resp.extensions.get("network_stream")
        stamped = isinstance(ns, Connection)
        start_ns = call_ns
        if isinstance(ns, Connection) and ns.request_start_ns >= call_ns:
            start_ns = ns.request_start_ns
        rec.start_s = (start_ns - t0_ns) / 1e9
        rec.send_delay_ms = (start_ns - call_ns) / _NS
        if resp.status_code != 200:
            excerpt = b""
            async for part in resp.aiter_raw():
                excerpt += part
                if len(excerpt) >= 2000:
                    break
            raise _Fail(ErrorKind.HTTP_STATUS, resp.reason_phrase or "error", resp.status_code,
                        _excerpt(excerpt))
        encoded = resp.headers.get("content-encoding", "identity").lower() not in ("", "identity")
        chunks = resp.aiter_bytes() if encoded else resp.aiter_raw()
        if endpoint == "generate":
            await _consume_generate(chunks, ns if stamped else None, rec, start_ns, t0_ns, strict, keep_times)
        else:
            await _consume_openai(chunks, ns if stamped else None, rec, start_ns, t0_ns,
                                  _TOKEN_PATTERNS[endpoint], strict, keep_times)
    finally:
        await resp.aclose()


async def _consume_openai(chunks: Any, ns: Connection | None, rec: RequestRecord, start_ns: int,
                          t0_ns: int, patterns: tuple[bytes, ...], strict: bool, keep_times: bool) -> None:
    """OpenAI chat/completions SSE: token events, then a usage chunk, then [DONE]."""
    buf = b""
    first_ns = last_ns = 0
    itl: list[float] = []
    times: list[float] | None = [] if keep_times else None
    usage: Mapping[str, Any] | None = None
    done = False
    pat0 = patterns[0]
    pat1 = patterns[1] if len(patterns) > 1 else None
    perf = time.perf_counter_ns
    async for chunk in chunks:
        ts = ns.last_read_ns if ns is not None else perf()
        if buf:
            chunk = buf + chunk
            buf = b""
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        pos = 0
        while True:
            end = chunk.find(b"\n\n", pos)
            if end < 0:
                buf = chunk[pos:]
                break
            block = chunk[pos:end]
            pos = end + 2
            if done:
                raise _Fail(ErrorKind.MALFORMED, "data after [DONE]", body=_excerpt(block))
            payload = block[6:] if block.startswith(b"data: ") and b"\n" not in block else _split_event(block)
            if payload is None:
                continue
            if payload[:1] != b"{" or payload[-1:] != b"}":
                if payload == b"[DONE]":
                    done = True
                    continue
                raise _Fail(ErrorKind.MALFORMED, "SSE data is not a JSON object", body=_excerpt(payload))
            token = pat0 in payload or (pat1 is not None and pat1 in payload)
            if strict or b'"usage":{' in payload or b'"error"' in payload or not token:
                obj = _decode(payload) if (strict or not token or b'"usage":{' in payload
                                          or b'"error"' in payload) else {}
                if "error" in obj and obj.get("error") is not None and "choices" not in obj:
                    raise _Fail(ErrorKind.SERVER_ERROR, _error_message(obj), body=_excerpt(payload))
                u = obj.get("usage")
                if isinstance(u, Mapping):
                    usage = u
                choices = obj.get("choices")
                if choices is not None and not isinstance(choices, list):
                    raise _Fail(ErrorKind.MALFORMED, "choices is not a list", body=_excerpt(payload))
                if strict and token and not choices:
                    token = False
                if choices:
                    fr = choices[0].get("finish_reason") if isinstance(choices[0], Mapping) else None
                    if fr is not None:
                        rec.finish_reason = str(fr)
            elif b'"finish_reason":"' in payload:
                i = payload.find(b'"finish_reason":"') + 17
                rec.finish_reason = payload[i:payload.find(b'"', i)].decode("utf-8", "replace")
            if token:
                if first_ns == 0:
                    first_ns = ts
                else:
                    itl.append((ts - last_ns) / _NS)
                last_ns = ts
                if times is not None:
                    times.append((ts - t0_ns) / 1e9)
    end_ns = perf()
    if buf.strip():
        raise _Fail(ErrorKind.INCOMPLETE, "stream ended inside an SSE event", body=_excerpt(buf))
    if not done:
        raise _Fail(ErrorKind.INCOMPLETE, "stream ended without data: [DONE]")
    if first_ns == 0:
        raise _Fail(ErrorKind.EMPTY, "stream finished without a token event")
    rec.ttft_ms = (first_ns - start_ns) / _NS
    rec.itl_ms = itl
    rec.token_times_s = times
    rec.e2e_ms = (end_ns - start_ns) / _NS
    rec.end_s = (end_ns - t0_ns) / 1e9
    if usage is None or not isinstance(usage.get("completion_tokens"), int):
        raise _Fail(ErrorKind.MISSING_USAGE, "no usage chunk with completion_tokens "
                    "(stream_options.include_usage ignored?)")
    rec.output_tokens = _counted(int(usage["completion_tokens"]), rec)
    pt = usage.get("prompt_tokens")
    rec.prompt_tokens = int(pt) if isinstance(pt, int) else None


async def _consume_generate(chunks: Any, ns: Connection | None, rec: RequestRecord, start_ns: int,
                            t0_ns: int, strict: bool, keep_times: bool) -> None:
    """SGLang native /generate SSE: cumulative text/output_ids, meta_info.completion_tokens.

    The SSE framing loop is the same as _consume_openai's, written out on purpose: it runs once per token
    (~5 µs of client CPU each at full speed) and a shared generator would add a resume per event."""
    buf = b""
    first_ns = last_ns = 0
    itl: list[float] = []
    event_tokens: list[int] = []
    times: list[float] | None = [] if keep_times else None
    final: Mapping[str, Any] | None = None
    done = False
    last_ct = 0
    perf = time.perf_counter_ns
    async for chunk in chunks:
        ts = ns.last_read_ns if ns is not None else perf()
        if buf:
            chunk = buf + chunk
            buf = b""
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        pos = 0
        while True:
            end = chunk.find(b"\n\n", pos)
            if end < 0:
                buf = chunk[pos:]
                break
            block = chunk[pos:end]
            pos = end + 2
            if done:
                raise _Fail(ErrorKind.MALFORMED, "data after [DONE]", body=_excerpt(block))
            payload = block[6:] if block.startswith(b"data: ") and b"\n" not in block else _split_event(block)
            if payload is None:
                continue
            if payload[:1] != b"{" or payload[-1:] != b"}":
                if payload == b"[DONE]":
                    done = True
                    continue
                raise _Fail(ErrorKind.MALFORMED, "SSE data is not a JSON object", body=_excerpt(payload))
            match = None if strict else _CT_RE.search(payload)
            if match is not None and b'"finish_reason":null' in payload and b'"error"' not in payload:
                ct = int(match.group(1))
            else:
                obj = _decode(payload)
                if "error" in obj and "meta_info" not in obj:
                    raise _Fail(ErrorKind.SERVER_ERROR, _error_message(obj), body=_excerpt(payload))
                meta = obj.get("meta_info")
                if not isinstance(meta, Mapping) or not isinstance(meta.get("completion_tokens"), int):
                    raise _Fail(ErrorKind.MALFORMED, "event without meta_info.completion_tokens",
                                body=_excerpt(payload))
                ct = int(meta["completion_tokens"])
                if meta.get("finish_reason") is not None:
                    final = meta
            if ct > last_ct:
                if first_ns == 0:
                    first_ns = ts
                else:
                    itl.append((ts - last_ns) / _NS)
                last_ns = ts
                event_tokens.append(ct - last_ct)
                last_ct = ct
                if times is not None:
                    times.append((ts - t0_ns) / 1e9)
    end_ns = perf()
    if buf.strip():
        raise _Fail(ErrorKind.INCOMPLETE, "stream ended inside an SSE event", body=_excerpt(buf))
    if not done:
        raise _Fail(ErrorKind.INCOMPLETE, "stream ended without data: [DONE]")
    if first_ns == 0:
        raise _Fail(ErrorKind.EMPTY, "stream finished without a token event")
    rec.ttft_ms = (first_ns - start_ns) / _NS
    rec.itl_ms = itl
    rec.event_tokens = event_tokens
    rec.token_times_s = times
    rec.e2e_ms = (end_ns - start_ns) / _NS
    rec.end_s = (end_ns - t0_ns) / 1e9
    if final is None:
        raise _Fail(ErrorKind.MISSING_USAGE, "no final event with meta_info.finish_reason")
    rec.output_tokens = _counted(int(final["completion_tokens"]), rec)
    pt = final.get("prompt_tokens")
    rec.prompt_tokens = int(pt) if isinstance(pt, int) else None
    fr = final.get("finish_reason")
    rec.finish_reason = str(fr.get("type")) if isinstance(fr, Mapping) else str(fr)
    acc = final.get("spec_accept_length")
    vct = final.get("spec_verify_ct")
    rec.accept_length = float(acc) if isinstance(acc, (int, float)) else None
    rec.verify_ct = int(vct) if isinstance(vct, int) else None
    if rec.accept_length is None and rec.verify_ct:
        rec.accept_length = rec.output_tokens / rec.verify_ct
