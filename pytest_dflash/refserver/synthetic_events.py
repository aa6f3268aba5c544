"""What the synthetic server (:mod:`.synthetic`) sends and counts: its :class:`Config`, the SSE events of
every (endpoint, token count) encoded once (:class:`Encoded`), the HTTP/1.1 framing of answers, the prompt
read from a request, and the timings it measured (:class:`Stats`, ``GET /stats``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

TOKEN_TEXT = " the"
TOKEN_ID = 279


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of an already sorted list."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk carrying one SSE event."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (no spaces), as a server writes them."""
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass(frozen=True, kw_only=True)
class Config:
    """What the server does for every request."""

    tokens: int = 128
    honor_max_tokens: bool = False
    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    model: str = "synth-model"
    tokens_per_event: tuple[int, ...] = (1,)  # /generate only: cycled per event (spec decoding)
    fault: str | None = None
    fault_every: int = 1
    record_prompts: bool = False  # keep every request's prompt text for GET /prompts (off: nothing kept)


@dataclass
class Stats:
    """What the server measured (perf_counter_ns clock)."""

    requests: int = 0
    faults: int = 0
    tokens: int = 0
    t_first_request_ns: int = 0
    t_last_token_ns: int = 0
    ttft_ns: list[int] = field(default_factory=list)
    itl_ns: list[int] = field(default_factory=list)
    skip: int = 0  # the next `skip` generation requests are served but not recorded (client warm-up)

    def summary(self) -> dict[str, Any]:
        ttft = sorted(v / 1e6 for v in self.ttft_ns)
        itl = sorted(v / 1e6 for v in self.itl_ns)
        window_s = max(self.t_last_token_ns - self.t_first_request_ns, 0) / 1e9
        return {
            "requests": self.requests,
            "faults": self.faults,
            "tokens": self.tokens,
            "window_s": window_s,
            "tokens_per_s": self.tokens / window_s if window_s > 0 else 0.0,
            "ttft_ms": {
                "n": len(ttft),
                "mean": sum(ttft) / len(ttft) if ttft else math.nan,
                "p50": percentile(ttft, 50),
                "p90": percentile(ttft, 90),
                "p99": percentile(ttft, 99),
            },
            "itl_ms": {
                "n": len(itl),
                "mean": sum(itl) / len(itl) if itl else math.nan,
                "p50": percentile(itl, 50),
                "p99": percentile(itl, 99),
            },
        }


class Encoded:
    """Pre-encoded event chunks for one (endpoint, token count) pair."""

    def __init__(self, endpoint: str, n: int, cfg: Config) -> None:
        self.first: bytes
        self.rest: list[bytes] = []  # one entry per later event
        self.raw: list[bytes] = []  # /generate: unframed payloads with a prompt_tokens placeholder
        self.event_tokens: list[int] = []  # tokens carried by each event, first included
        m = cfg.model
        if endpoint == "generate":
            pattern = cfg.tokens_per_event
            counts: list[int] = []
            done = 0
            while done < n:
                k = min(pattern[len(counts) % len(pattern)], n - done)
                counts.append(k)
                done += k
            self.event_tokens = counts
            cum = 0
            for i, k in enumerate(counts):
                cum += k
                meta: dict[str, Any] = {
                    "id": "synth",
                    "finish_reason": None,
                    "prompt_tokens": "@P@",
                    "completion_tokens": cum,
                }
                if i == len(counts) - 1:
                    meta["finish_reason"] = {"type": "length", "length": n}
                    meta["spec_verify_ct"] = len(counts)
                    meta["spec_accept_length"] = n / len(counts)
                obj = {"text": TOKEN_TEXT * cum, "output_ids": [TOKEN_ID] * cum, "meta_info": meta}
                self.raw.append(dumps(obj))
            self.first, self.rest = b"", []
            return
        self.event_tokens = [1] * n
        if endpoint == "chat":
            base = {"id": "synth", "object": "chat.completion.chunk", "created": 0, "model": m}

            def ev(delta: dict[str, Any], finish: str | None) -> bytes:
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                return chunk(dumps({**base, "choices": [choice]}))

            self.first = ev({"role": "assistant", "content": TOKEN_TEXT}, "length" if n == 1 else None)
            mid = ev({"content": TOKEN_TEXT}, None)
            self.rest = [mid] * (n - 2) + [ev({"content": TOKEN_TEXT}, "length")] if n > 1 else []
        else:
            base = {"id": "synth", "object": "text_completion", "created": 0, "model": m}

            def evc(finish: str | None) -> bytes:
                choice = {"index": 0, "text": TOKEN_TEXT, "logprobs": None, "finish_reason": finish}
                return chunk(dumps({**base, "choices": [choice], "usage": None}))

            self.first = evc("length" if n == 1 else None)
            self.rest = [evc(None)] * (n - 2) + [evc("length")] if n > 1 else []

    def usage_chunk(self, endpoint: str, model: str, prompt_tokens: int, n: int) -> bytes:
        if endpoint == "generate":
            return b""
        obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        return chunk(dumps({"id": "synth", "object": obj, "created": 0, "model": model, "choices": [],
                            "usage": usage}))


DONE_CHUNK = chunk(b"[DONE]")
END_CHUNK = b"0\r\n\r\n"
SSE_HEADERS = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\nserver: synth\r\n\r\n"
)


def json_response(status: int, obj: Any, *, keep_alive: bool = True) -> bytes:
    """A whole HTTP/1.1 answer: JSON of `obj`, or `obj` itself as text/plain when it is bytes."""
    body = obj if isinstance(obj, bytes) else dumps(obj)
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error"}[status]
    ctype = b"text/plain" if isinstance(obj, bytes) else b"application/json"
    conn = b"" if keep_alive else b"connection: close\r\n"
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%sserver: synth\r\n\r\n%s"
        % (status, reason, ctype, len(body), conn, body)
    )


def prompt_text(endpoint: str, req: dict[str, Any]) -> str:
    """The request's prompt: chat messages' contents joined by spaces, the completion prompt, or /generate
    text."""
    if endpoint == "chat":
        msgs = req.get("messages") or []
        return " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
    if endpoint == "completions":
        return str(req.get("prompt", ""))
    return str(req.get("text", ""))


def count_prompt_tokens(endpoint: str, req: dict[str, Any]) -> int:
    """Whitespace word count of the prompt (the synthetic server has no tokenizer)."""
    return len(prompt_text(endpoint, req).split())
