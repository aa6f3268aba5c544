"""Per-token latency of one streamed request: the smoke suite's sanity ceiling (a server streaming a few
tokens a second is broken, whatever its outputs), judged like the perf layer's floors."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_dflash.client.answers import event_has_text, event_tokens
from pytest_dflash.client.sampling import Stream
from pytest_dflash.layers.perf.judgement import Judgement

# Sanity ceiling on the time per output token of one streamed request: a server slower than 4 tokens a second
# is broken whatever its outputs. Generous on purpose: a 400B-class model at concurrency 1 on one H200 node
# streams 20-40 tokens a second (25-50 ms); the refserver 2-15 ms. --tpot-ceiling-ms changes it.
DEFAULT_TPOT_CEILING_MS = 250.0
# Tokens that all came within this of the first were delivered whole (a buffering proxy or gateway, or a
# server this fast): their gaps are not measured; hidden_tpot_bound_ms says how much they could hide.
WHOLE_STREAM_MS = 1.0
PER_TOKEN_FLOOR = re.compile(r"^(itl|tpot)_(mean|median|p\d+(?:\.\d+)?)_ms$")


@dataclass(frozen=True, kw_only=True)
class TokenLatency:
    """Time to first token and time per output token after it, of one streamed request."""

    tokens: int
    ttft_ms: float
    tpot_ms: float | None  # None: fewer than two token-bearing events (nothing after the first)
    events: int

    @property
    def tokens_per_s(self) -> float | None:
        return 1000.0 / self.tpot_ms if self.tpot_ms else None


def stream_token_latency(stream: Stream, tokens: int) -> TokenLatency:
    """bench_serving's TPOT: (last token's arrival - first token's arrival) / (tokens after the first event).

    Native events carry cumulative output_ids, so the first event's token count is known (a speculative server
    may send several tokens in it); an OpenAI chunk counts as one token.
    """
    first: tuple[float, int] | None = None
    last = 0.0
    count = 0
    for arrival, event in zip(stream.arrival_s, stream.events, strict=False):
        cumulative = event_tokens(event)
        grew = cumulative is not None and cumulative > count
        if not grew and not (cumulative is None and event_has_text(event)):
            continue
        count = cumulative if cumulative is not None else count + 1
        if first is None:
            first = (arrival, count)
        last = arrival
    if first is None:
        return TokenLatency(tokens=tokens, ttft_ms=math.nan, tpot_ms=None, events=len(stream.events))
    after = tokens - first[1]
    span_ms = (last - first[0]) * 1000.0
    tpot = span_ms / after if after > 0 and span_ms >= WHOLE_STREAM_MS else None
    return TokenLatency(tokens=tokens, ttft_ms=first[0] * 1000.0, tpot_ms=tpot, events=len(stream.events))


def hidden_tpot_bound_ms(ttft_ms: float, tokens: int) -> float | None:
    """The most time per token a stream delivered whole can hide: all of it in the time to the first token."""
    if tokens < 2 or math.isnan(ttft_ms):
        return None
    return ttft_ms / (tokens - 1)


def token_latency_ceiling(floors: Mapping[str, float | str], option_ms: float | None) -> tuple[float, str]:
    """The sanity ceiling on time per output token and where it comes from.

    ``--tpot-ceiling-ms`` when given; else DEFAULT_TPOT_CEILING_MS, raised to the largest per-token latency
    ceiling of the service's [floors] table (``itl_*_ms``, ``tpot_*_ms``) where that is higher: a profile that
    declares a slower service is not failed by the generic ceiling.
    """
    if option_ms is not None:
        return option_ms, "--tpot-ceiling-ms"
    declared = {key: float(value) for key, value in floors.items()
                if PER_TOKEN_FLOOR.match(key) and isinstance(value, int | float)}
    if declared:
        key = max(declared, key=lambda k: declared[k])
        if declared[key] > DEFAULT_TPOT_CEILING_MS:
            return declared[key], f"the profile's {key}"
    return DEFAULT_TPOT_CEILING_MS, "the default sanity ceiling"


def judge_token_latency(latency: TokenLatency, ceiling_ms: float, source: str) -> Judgement:
    """One request's time per output token against a sanity ceiling (not a perf floor: no bound, one
    sample)."""
    key = "tpot_sanity_ms"
    bound = hidden_tpot_bound_ms(latency.ttft_ms, latency.tokens)
    if latency.tpot_ms is None and latency.events > 1 and bound is not None and bound <= ceiling_ms:
        # delivered whole (a buffer, or a server this fast): even if the time to the first token hid every
        # later token's, none took longer than this, so the ceiling holds whatever the gaps were
        return Judgement(key=key, outcome="pass", point=bound, threshold=ceiling_ms, n=1,
                         message=f"TPOT (time per output token) pass — {latency.tokens} tokens came "
                                 f"within {WHOLE_STREAM_MS:g} ms of the first, after a TTFT of "
                                 f"{latency.ttft_ms:.0f} ms: at most {bound:.1f} ms per token <= ceiling "
                                 f"{ceiling_ms:g} ms ({source})")
    if latency.tpot_ms is None:
        return Judgement(key=key, outcome="inconclusive", threshold=ceiling_ms,
                         message=f"TPOT (time per output token) INCONCLUSIVE — {latency.tokens} tokens came "
                                 f"in {latency.events} event(s) within {WHOLE_STREAM_MS:g} ms of the first: "
                                 "nothing streamed after the first token (one event, or a proxy or gateway "
                                 "that buffers the stream)")
    rate = 1000.0 / latency.tpot_ms
    if latency.tpot_ms > ceiling_ms:
        return Judgement(key=key, outcome="fail", point=latency.tpot_ms, threshold=ceiling_ms, n=1,
                         message=f"TPOT (time per output token) FAIL — {latency.tpot_ms:.1f} ms "
                                 f"({rate:.1f} tokens/s) > ceiling {ceiling_ms:g} ms ({source}) on one "
                                 f"streamed greedy request of {latency.tokens} tokens (TTFT "
                                 f"{latency.ttft_ms:.0f} ms): a server this slow per token is broken "
                                 "whatever its outputs")
    return Judgement(key=key, outcome="pass", point=latency.tpot_ms, threshold=ceiling_ms, n=1,
                     message=f"TPOT (time per output token) pass — {latency.tpot_ms:.1f} ms ({rate:.1f} "
                             f"tokens/s) <= ceiling {ceiling_ms:g} ms ({source}), TTFT {latency.ttft_ms:.0f} "
                             f"ms, {latency.tokens} tokens")


__all__ = ["DEFAULT_TPOT_CEILING_MS", "PER_TOKEN_FLOOR", "TokenLatency", "judge_token_latency",
           "stream_token_latency", "token_latency_ceiling"]
