"""Reading a server-sent event stream: its lines under byte caps (`capped_lines`) and each line as an event
(`sse_event`). The client (client/inference.py) owns the call, its deadline and its errors; this module only
reads, and says what is wrong with a line in a message the client raises as an ApiError."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from pytest_dflash.client.bodies import NEWLINES
from pytest_dflash.documents import loads_json

__all__ = ["DONE", "SKIP", "capped_lines", "sse_event"]

DONE = "[DONE]"
SKIP = None  # a blank line or an SSE comment: nothing to read


def capped_lines(response: httpx.Response, line_cap: int, total_cap: int, *, on_bytes: Callable[[int], None],
                 too_large: Callable[[int, str, bytes], Exception]) -> Iterator[str]:
    """`response.iter_lines()` (str.splitlines semantics, as httpx), raising `too_large(cap, seen, head)` on a
    line or a total over its cap; `on_bytes(total)` is told after every chunk (the client checks its deadline
    there: blank lines and SSE comments do not buy time)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        on_bytes(total)
        if total > total_cap:
            raise too_large(total_cap, f"stream of {total}+ bytes", b"")
        text = pending + decoder.decode(chunk)
        hold_cr = text.endswith("\r")  # "\r\n" may be split across chunks: decide with the next one
        if hold_cr:
            text = text[:-1]
        lines = text.splitlines()
        pending = lines.pop() if lines and text[-1:] not in NEWLINES else ""
        if hold_cr:
            pending += "\r"
        if len(pending) > line_cap:
            raise too_large(line_cap, f"an SSE line of {len(pending)}+ bytes", pending[:200].encode())
        for line in lines:
            if len(line) > line_cap:
                raise too_large(line_cap, f"an SSE line of {len(line)} bytes", line[:200].encode())
            yield line
    rest = (pending + decoder.decode(b"", final=True)).splitlines()
    yield from rest


def sse_event(line: str) -> dict[str, Any] | str | None:
    """One line of a stream: SKIP (blank, ':' comment), DONE, or its event object; ValueError naming what is
    wrong with a line that is none of these."""
    if not line.strip() or line.startswith(":"):
        return SKIP  # blank lines end events; ':' lines are SSE comments (a proxy's keep-alive pings)
    if not line.startswith("data:"):
        raise ValueError(f"malformed SSE line: {line[:200]!r}")
    payload = line[5:].strip()
    if payload == DONE:
        return DONE
    try:
        event = loads_json(payload)
    except ValueError as exc:  # JSONDecodeError, DocumentTooDeep
        raise ValueError(f"SSE event is not JSON ({exc}): {payload[:200]!r}") from exc
    if not isinstance(event, dict):
        raise ValueError(f"SSE event is not an object: {payload[:200]!r}")
    return event
