"""What a well-formed answer looks like: token counts, finish reasons, choices and a server-sent event stream.

Each check raises AssertionError naming what is wrong and where (`what`), with the evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from pytest_dflash.client.answers import AnswerApi, streamed_answer
from pytest_dflash.client.sampling import Generation, Sampling, Stream


def fail(message: str) -> NoReturn:
    __tracebackhide__ = True
    raise AssertionError(message)


def check_completion_shape(gen: Generation, sampling: Sampling, *, what: str) -> None:
    """A finished generation: tokens counted, a finish reason that fits max_tokens."""
    __tracebackhide__ = True
    if gen.finish_reason not in ("length", "stop"):
        fail(f"{what}: finish_reason {gen.finish_reason!r}, expected 'length' or 'stop' "
             f"(meta: {dict(gen.meta or gen.usage)})")
    if gen.completion_tokens is None or gen.completion_tokens <= 0:
        fail(f"{what}: completion_tokens = {gen.completion_tokens!r}; a generation must produce tokens")
    if gen.completion_tokens > sampling.max_tokens:
        fail(f"{what}: {gen.completion_tokens} tokens for max_tokens={sampling.max_tokens}")
    if gen.finish_reason == "length" and gen.completion_tokens != sampling.max_tokens:
        fail(f"{what}: finish_reason 'length' after {gen.completion_tokens} of {sampling.max_tokens} tokens")
    if gen.output_ids is not None and len(gen.output_ids) != gen.completion_tokens:
        fail(f"{what}: {len(gen.output_ids)} output_ids but completion_tokens = {gen.completion_tokens}")


def check_full_length(gens: Sequence[Generation], sampling: Sampling, *, what: str) -> None:
    """With ignore_eos every sample must run to max_tokens and say so ('length')."""
    __tracebackhide__ = True
    if sampling.n > 1 and len(gens) != sampling.n:
        fail(f"{what}: {len(gens)} samples for n={sampling.n}")
    per_choice = len(gens) == 1 or gens[0].output_ids is not None
    for index, gen in enumerate(gens):
        label = f"{what} (sample {index})" if len(gens) > 1 else what
        if gen.finish_reason != "length":
            fail(f"{label}: finish_reason {gen.finish_reason!r} with ignore_eos and "
                  f"max_tokens={sampling.max_tokens}, expected 'length' (text {gen.text[:80]!r})")
        if per_choice:
            check_completion_shape(gen, sampling, what=label)
    if not per_choice:  # OpenAI: usage counts all choices together
        tokens = gens[0].completion_tokens
        if tokens != sampling.max_tokens * len(gens):
            fail(f"{what}: usage.completion_tokens = {tokens} for {len(gens)} choices of "
                  f"{sampling.max_tokens} tokens each")
        indices = sorted(g.index for g in gens if g.index is not None)
        if indices != list(range(len(gens))):
            fail(f"{what}: choice indices {indices}, expected 0..{len(gens) - 1}")


@dataclass
class StreamCheck:
    stream: Stream
    text: str
    tokens: int | None


def check_stream(stream: Stream, *, native: bool, max_tokens: int, what: str,
                 chat: bool = False) -> StreamCheck:
    """Well-formed SSE: events, monotonic cumulative output (native), final usage / finish, [DONE]."""
    __tracebackhide__ = True
    if not stream.content_type.startswith("text/event-stream"):
        fail(f"{what}: content-type {stream.content_type!r}, expected text/event-stream")
    if not stream.events:
        fail(f"{what}: no events before the stream ended")
    if not stream.done:
        fail(f"{what}: stream ended without 'data: [DONE]' after {len(stream.events)} events "
              f"(last line {stream.raw_lines[-1:]!r})")
    if any(b < a for a, b in zip(stream.arrival_s, stream.arrival_s[1:], strict=False)):
        fail(f"{what}: event arrival times go backwards: {stream.arrival_s}")
    api: AnswerApi = "generate" if native else ("chat" if chat else "completions")
    framing = streamed_answer(stream.events, api, done=stream.done).framing
    assert framing is not None  # a streamed answer's
    last_line = stream.raw_lines[-1][:300] if stream.raw_lines else ""
    if native:
        previous: tuple[object, ...] = ()
        for index, ids in enumerate(framing.output_ids):
            ids = ids or ()
            if ids[: len(previous)] != previous:
                fail(f"{what}: event {index} output_ids {list(ids)} do not extend the previous "
                     f"{list(previous)}")
            previous = ids
        if not framing.last_finish:
            fail(f"{what}: last event has no finish_reason: {last_line}")
        tokens = framing.last_tokens
        if tokens != len(previous):
            fail(f"{what}: completion_tokens {tokens} != {len(previous)} streamed ids")
        return StreamCheck(stream, framing.last_text, tokens if isinstance(tokens, int) else None)
    if not framing.usage_chunks:
        fail(f"{what}: no final usage chunk (choices: [] with usage) although include_usage was requested")
    if not framing.usage_last:
        fail(f"{what}: the usage chunk is not the last event: {last_line}")
    chunks = framing.chunks
    if chat and chunks and chunks[0].role not in ("assistant", None):
        fail(f"{what}: first chat delta has role {chunks[0].role!r}")
    text = "".join(c.text for c in chunks)
    finishes = [c.finish_reason for c in chunks if c.finish_reason]
    if not finishes:
        fail(f"{what}: no chunk carried a finish_reason")
    if len(finishes) != 1 or chunks[-1].finish_reason != finishes[0]:
        fail(f"{what}: finish_reason must come once, on the last choice chunk; got {finishes}")
    tokens = framing.usage_tokens
    if not isinstance(tokens, int) or not 0 < tokens <= max_tokens:
        fail(f"{what}: usage.completion_tokens = {tokens!r} for max_tokens={max_tokens}")
    return StreamCheck(stream, text, tokens)

__all__ = ["StreamCheck", "check_completion_shape", "check_full_length", "check_stream", "fail"]
