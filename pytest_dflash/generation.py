"""Generation-layer checks: each one sends real requests and raises AssertionError with the evidence.

Suites call these; they hold the logic so it can be unit-tested against real servers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from .client import GREEDY, SAMPLED, Generation, InferenceClient, Sampling, Stream

PROMPT = "The quick brown fox"


def _fail(message: str) -> NoReturn:
    raise AssertionError(message)


def _generate(client: InferenceClient, prompt: str, sampling: Sampling, *, native: bool,
              timeout_s: float | None = None) -> Generation:
    if native:
        return client.generate(prompt, sampling, timeout_s=timeout_s)
    return client.completion(prompt, sampling, timeout_s=timeout_s)[0]


def check_completion_shape(gen: Generation, sampling: Sampling, *, what: str) -> None:
    """A finished generation: tokens counted, a finish reason that fits max_tokens."""
    __tracebackhide__ = True
    if gen.finish_reason not in ("length", "stop"):
        _fail(f"{what}: finish_reason {gen.finish_reason!r}, expected 'length' or 'stop' (meta: {gen.meta})")
    if gen.completion_tokens is None or gen.completion_tokens <= 0:
        _fail(f"{what}: completion_tokens = {gen.completion_tokens!r}; a generation must produce tokens")
    if gen.completion_tokens > sampling.max_tokens:
        _fail(f"{what}: {gen.completion_tokens} tokens for max_tokens={sampling.max_tokens}")
    if gen.finish_reason == "length" and gen.completion_tokens != sampling.max_tokens:
        _fail(f"{what}: finish_reason 'length' after {gen.completion_tokens} of {sampling.max_tokens} tokens")
    if gen.output_ids is not None and len(gen.output_ids) != gen.completion_tokens:
        _fail(f"{what}: {len(gen.output_ids)} output_ids but completion_tokens = {gen.completion_tokens}")


def greedy(client: InferenceClient, *, native: bool, max_tokens: int = 16) -> Generation:
    """One greedy generation, checked; returns it."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    gen = _generate(client, PROMPT, sampling, native=native)
    check_completion_shape(gen, sampling, what="greedy generation")
    return gen


def sampled(client: InferenceClient, *, native: bool, seed: int | None = None, max_tokens: int = 16,
            timeout_s: float | None = None) -> Generation:
    """One sampled generation through the top-k/top-p kernel (the request that killed seed 004's server)."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=SAMPLED.temperature, top_k=SAMPLED.top_k,
                        top_p=SAMPLED.top_p, seed=seed, ignore_eos=True)
    gen = _generate(client, PROMPT, sampling, native=native, timeout_s=timeout_s)
    check_completion_shape(gen, sampling, what="sampled generation (temperature 0.8, top_k 20, top_p 0.9)")
    return gen


@dataclass
class StreamCheck:
    stream: Stream
    text: str
    tokens: int | None


def check_stream(stream: Stream, *, native: bool, max_tokens: int, what: str) -> StreamCheck:
    """Well-formed SSE: events, monotonic cumulative output (native), final usage / finish, [DONE]."""
    __tracebackhide__ = True
    if not stream.content_type.startswith("text/event-stream"):
        _fail(f"{what}: content-type {stream.content_type!r}, expected text/event-stream")
    if not stream.events:
        _fail(f"{what}: no events before the stream ended")
    if not stream.done:
        _fail(f"{what}: stream ended without 'data: [DONE]' after {len(stream.events)} events "
              f"(last line {stream.raw_lines[-1:]!r})")
    if native:
        previous: list[int] = []
        for index, event in enumerate(stream.events):
            ids = event.get("output_ids") or []
            if ids[: len(previous)] != previous:
                _fail(f"{what}: event {index} output_ids {ids} do not extend the previous {previous}")
            previous = ids
        final = stream.events[-1]
        meta: dict[str, Any] = final.get("meta_info") or {}
        reason = meta.get("finish_reason")
        if not reason:
            _fail(f"{what}: last event has no finish_reason: {final}")
        tokens = meta.get("completion_tokens")
        if tokens != len(previous):
            _fail(f"{what}: completion_tokens {tokens} != {len(previous)} streamed ids")
        return StreamCheck(stream, str(final.get("text", "")), tokens)
    usage_events = [e for e in stream.events if e.get("usage") and not e.get("choices")]
    if not usage_events:
        _fail(f"{what}: no final usage chunk (choices: [] with usage) although include_usage was requested")
    text = "".join(str(c.get("text") or (c.get("delta") or {}).get("content") or "")
                   for e in stream.events for c in e.get("choices") or [])
    finishes = [c.get("finish_reason") for e in stream.events for c in e.get("choices") or [] if c.get("finish_reason")]
    if not finishes:
        _fail(f"{what}: no chunk carried a finish_reason")
    tokens = usage_events[-1]["usage"].get("completion_tokens")
    if not isinstance(tokens, int) or not 0 < tokens <= max_tokens:
        _fail(f"{what}: usage.completion_tokens = {tokens!r} for max_tokens={max_tokens}")
    return StreamCheck(stream, text, tokens)


def streamed(client: InferenceClient, *, native: bool, max_tokens: int = 16) -> StreamCheck:
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if native:
        stream = client.generate_stream(PROMPT, sampling)
    else:
        stream = client.completion_stream(PROMPT, sampling)
    return check_stream(stream, native=native, max_tokens=max_tokens, what="streamed generation")


def accept_length(client: InferenceClient, prompts: Sequence[str], *, max_tokens: int = 64) -> float:
    """Mean accept length (tokens per verify step, bonus included) over `prompts`, from meta_info."""
    __tracebackhide__ = True
    tokens = steps = 0
    for prompt in prompts:
        gen = client.generate(prompt, Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        if gen.verify_ct is None or gen.completion_tokens is None:
            _fail(f"no spec_verify_ct in meta_info of a speculative server: {sorted(gen.meta)}")
        assert gen.verify_ct is not None and gen.completion_tokens is not None
        if gen.verify_ct <= 0:
            _fail(f"spec_verify_ct = {gen.verify_ct} for {gen.completion_tokens} tokens")
        tokens += gen.completion_tokens
        steps += gen.verify_ct
    return tokens / steps if steps else 0.0


__all__ = ["GREEDY", "SAMPLED", "StreamCheck", "accept_length", "check_completion_shape", "check_stream",
           "greedy", "sampled", "streamed"]
