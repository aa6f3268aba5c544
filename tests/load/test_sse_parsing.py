"""SSE parsing on real SGLang 0.5.17 streams (recorded on an H200), in every chunking."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.load.results import ErrorKind, RequestRecord
from pytest_dflash.load.sse import _TOKEN_PATTERNS, _consume_generate, _consume_openai, _Fail

DATA = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200" / "perf" / "sse_streams.json"
STREAMS: dict[str, Any] = json.loads(DATA.read_text())["streams"]


def _body(name: str) -> bytes:
    """The stream as it came off the wire: each event line followed by its newline."""
    return b"".join(line.encode() + b"\n" for line in STREAMS[name]["sse_lines"])


def _chunks(body: bytes, how: str) -> list[bytes]:
    if how == "whole":
        return [body]
    if how == "events":
        return [e + b"\n\n" for e in body.split(b"\n\n") if e]
    if how == "tiny":
        return [body[i : i + 7] for i in range(0, len(body), 7)]
    rng = random.Random(how)
    out, i = [], 0
    while i < len(body):
        n = rng.randint(1, 400)
        out.append(body[i : i + n])
        i += n
    return out


async def _aiter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def _parse(name: str, chunks: list[bytes], *, strict: bool = False) -> RequestRecord:
    rec = RequestRecord(index=0)
    path = STREAMS[name]["path"]

    async def go() -> None:
        if path == "/generate":
            await _consume_generate(_aiter(chunks), None, rec, 0, 0, strict, True)
        else:
            endpoint = "chat" if "chat" in path else "completions"
            await _consume_openai(_aiter(chunks), None, rec, 0, 0, _TOKEN_PATTERNS[endpoint], strict, True)

    asyncio.run(go())
    return rec


CHUNKINGS = ["whole", "events", "tiny", "seed-1", "seed-2"]


@pytest.mark.parametrize("server", ["dflash", "plain"])
@pytest.mark.parametrize("how", CHUNKINGS)
@pytest.mark.parametrize("strict", [False, True])
def test_chat_stream(server: str, how: str, strict: bool) -> None:
    rec = _parse(f"{server}/chat_completions_stream", _chunks(_body(f"{server}/chat_completions_stream"), how),
                 strict=strict)
    # role chunk (content "") + 7 content chunks carry tokens; the finish chunk and usage do not
    assert rec.token_times_s is not None and len(rec.token_times_s) == 8
    assert len(rec.itl_ms) == 7
    assert rec.output_tokens == 12  # from usage, not from the 8 chunks
    assert rec.prompt_tokens == 15
    assert rec.finish_reason == "length"
    assert rec.ttft_ms is not None


@pytest.mark.parametrize("server", ["dflash", "plain"])
@pytest.mark.parametrize("how", CHUNKINGS)
def test_completions_stream(server: str, how: str) -> None:
    rec = _parse(f"{server}/completions_stream", _chunks(_body(f"{server}/completions_stream"), how))
    assert rec.token_times_s is not None and len(rec.token_times_s) == 16  # empty-text events are tokens too
    assert rec.output_tokens == 16 and rec.prompt_tokens == 4
    assert rec.finish_reason == "length"


@pytest.mark.parametrize("how", CHUNKINGS)
@pytest.mark.parametrize("strict", [False, True])
def test_generate_stream_with_dflash_meta_info(how: str, strict: bool) -> None:
    rec = _parse("dflash/generate_stream", _chunks(_body("dflash/generate_stream"), how), strict=strict)
    assert rec.output_tokens == 16 and rec.prompt_tokens == 4
    assert rec.event_tokens == [1] * 16
    assert rec.verify_ct == 15
    assert rec.accept_length == pytest.approx(16 / 15)
    assert rec.finish_reason == "length"


def test_generate_stream_without_speculation() -> None:
    rec = _parse("plain/generate_stream", _chunks(_body("plain/generate_stream"), "whole"))
    assert rec.output_tokens == 16
    assert rec.accept_length is None and rec.verify_ct is None


def test_generate_multi_token_events_count_tokens_per_event() -> None:
    metas: list[dict[str, Any]] = [{"completion_tokens": k, "prompt_tokens": 3, "finish_reason": None}
                                   for k in (3, 4, 8)]
    metas[-1].update(finish_reason={"type": "length", "length": 8}, spec_verify_ct=3, spec_accept_length=8 / 3)
    events = [{"text": "a" * m["completion_tokens"], "meta_info": m} for m in metas]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    rec = RequestRecord(index=0)
    asyncio.run(_consume_generate(_aiter([body]), None, rec, 0, 0, False, False))
    assert rec.event_tokens == [3, 1, 4]
    assert rec.output_tokens == 8 and rec.verify_ct == 3 and rec.accept_length == pytest.approx(8 / 3)


def _broken(name: str, mutate: Any) -> ErrorKind:
    lines = list(STREAMS[name]["sse_lines"])
    lines = mutate(lines)
    body = b"".join(line.encode() + b"\n" for line in lines)
    with pytest.raises(_Fail) as info:
        _parse_body(name, body)
    return info.value.error.kind


def _parse_body(name: str, body: bytes) -> RequestRecord:
    rec = RequestRecord(index=0)
    path = STREAMS[name]["path"]

    async def go() -> None:
        if path == "/generate":
            await _consume_generate(_aiter([body]), None, rec, 0, 0, False, False)
        else:
            endpoint = "chat" if "chat" in path else "completions"
            await _consume_openai(_aiter([body]), None, rec, 0, 0, _TOKEN_PATTERNS[endpoint], False, False)

    asyncio.run(go())
    return rec


@pytest.mark.parametrize("name", ["dflash/chat_completions_stream", "dflash/completions_stream",
                                  "dflash/generate_stream"])
def test_stream_without_done_is_incomplete(name: str) -> None:
    assert _broken(name, lambda ls: [x for x in ls if x != "data: [DONE]"]) is ErrorKind.INCOMPLETE


@pytest.mark.parametrize("name", ["dflash/chat_completions_stream", "dflash/completions_stream"])
def test_stream_without_usage_is_missing_usage(name: str) -> None:
    assert _broken(name, lambda ls: [x for x in ls if '"usage":{' not in x]) is ErrorKind.MISSING_USAGE


def test_generate_without_final_meta_is_missing_usage() -> None:
    def drop_last_event(ls: list[str]) -> list[str]:
        data = [i for i, x in enumerate(ls) if x.startswith("data: {")]
        return ls[: data[-1]] + ls[data[-1] + 1 :]

    assert _broken("dflash/generate_stream", drop_last_event) is ErrorKind.MISSING_USAGE


@pytest.mark.parametrize("name", ["dflash/chat_completions_stream", "dflash/completions_stream",
                                  "dflash/generate_stream"])
def test_truncated_json_is_malformed(name: str) -> None:
    def cut(ls: list[str]) -> list[str]:
        i = next(i for i, x in enumerate(ls) if x.startswith("data: {"))
        return [*ls[:i], ls[i][:60], *ls[i + 1 :]]

    assert _broken(name, cut) is ErrorKind.MALFORMED


def test_garbage_event_is_malformed() -> None:
    assert _broken("dflash/chat_completions_stream",
                   lambda ls: ["data: <html>502 Bad Gateway</html>", "", *ls]) is ErrorKind.MALFORMED


def test_in_stream_error_event_is_a_server_error() -> None:
    err = 'data: {"error": {"message": "CUDA out of memory", "code": 500}}'
    assert _broken("dflash/chat_completions_stream", lambda ls: [*ls[:4], err, "", *ls[4:]]) \
        is ErrorKind.SERVER_ERROR
    assert _broken("dflash/generate_stream", lambda ls: [*ls[:4], err, "", *ls[4:]]) is ErrorKind.SERVER_ERROR


def test_data_after_done_is_malformed() -> None:
    assert _broken("dflash/completions_stream", lambda ls: [*ls, 'data: {"choices": []}', ""]) \
        is ErrorKind.MALFORMED


def test_crlf_comments_and_multiline_data_are_sse() -> None:
    name = "dflash/chat_completions_stream"
    body = _body(name).replace(b"\n", b"\r\n")
    body = b": keep-alive\r\n\r\n" + body
    rec = _parse_body(name, body)
    assert rec.output_tokens == 12 and rec.token_times_s is None and len(rec.itl_ms) == 7
    # a JSON object split over two data: lines (joined with "\n", still valid JSON)
    lines = list(STREAMS[name]["sse_lines"])
    usage = next(i for i, x in enumerate(lines) if '"usage":{' in x)
    head, tail = lines[usage].split('"choices"', 1)
    lines[usage : usage + 1] = [head, 'data: "choices"' + tail]
    rec = _parse_body(name, b"".join(x.encode() + b"\n" for x in lines))
    assert rec.output_tokens == 12


def test_empty_stream_has_no_token() -> None:
    body = b'data: {"choices":[],"usage":{"completion_tokens":0,"prompt_tokens":3}}\n\ndata: [DONE]\n\n'
    with pytest.raises(_Fail) as info:
        rec = RequestRecord(index=0)
        asyncio.run(_consume_openai(_aiter([body]), None, rec, 0, 0, _TOKEN_PATTERNS["chat"], False, False))
    assert info.value.error.kind is ErrorKind.EMPTY


@pytest.mark.parametrize("name", ["dflash/generate_stream", "dflash/chat_completions_stream",
                                  "dflash/completions_stream"])
def test_more_completion_tokens_than_the_request_allowed_is_malformed(name: str) -> None:
    """Throughput is computed from the server's completion_tokens: a server that over-counts them (3x, as a
    proxy did in a hostile run: 850 "tok/s" and accept length 14.8 with 8-token blocks) once passed every
    throughput floor. A count above the request's max_tokens is refused."""
    body = _body(name)
    honest = _parse_body(name, body).output_tokens
    assert honest

    def parse(max_tokens: int) -> RequestRecord:
        rec = RequestRecord(index=0, max_tokens=max_tokens)
        if STREAMS[name]["path"] == "/generate":
            coro = _consume_generate(_aiter([body]), None, rec, 0, 0, False, False)
        else:
            endpoint = "chat" if "chat" in name else "completions"
            coro = _consume_openai(_aiter([body]), None, rec, 0, 0, _TOKEN_PATTERNS[endpoint], False, False)
        asyncio.run(coro)
        return rec

    assert parse(honest).output_tokens == honest
    with pytest.raises(_Fail, match=f"the server reports {honest} completion tokens for a request of at most "
                                    f"{honest - 1}") as info:
        parse(honest - 1)
    assert info.value.error.kind is ErrorKind.MALFORMED
