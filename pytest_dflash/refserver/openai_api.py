"""``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` in SGLang 0.5.17's shapes."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pytest_dflash.refserver.chat_surface import (
    ToolCallStream,
    parse_tool_calls,
    require_reasoning,
    split_reasoning,
    tool_call_schema,
    tool_calls_cut,
    tool_calls_from_constrained,
)
from pytest_dflash.refserver.model import apply_chat_template
from pytest_dflash.refserver.params import LOGPROB_REFUSED, BadRequest, check_grammar, parse_sampling_params
from pytest_dflash.refserver.scheduler import Output
from pytest_dflash.refserver.spec import SamplingParams
from pytest_dflash.refserver.state import Batch, Gen, ServerState, corrupt, dumps
from pytest_dflash.refserver.structured import (
    GRAMMAR_KINDS,
    NO_BACKEND,
    InvalidGrammar,
    response_format_schema,
)

__all__ = ["add_routes"]

OPENAI_SAMPLING = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "stop": "stop",
    "stop_token_ids": "stop_token_ids", "seed": "sampling_seed", "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "repetition_penalty": "repetition_penalty",
}  # fmt: skip


def openai_error(message: str, status: int = 400) -> JSONResponse:
    """The OpenAI-style error body SGLang returns on /v1/*."""
    return JSONResponse(
        {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": status},
        status_code=status,
    )


def missing_field(body: dict[str, Any], field: str, func: str, path: str) -> JSONResponse:
    """Pydantic's 'Field required', worded as SGLang 0.5.17 reports it."""
    err = {"type": "missing", "loc": ("body", field), "msg": "Field required", "input": body}
    where = f'  File "{__file__}", line 1, in {func}\n    POST {path} {[err]}'
    return openai_error(f"1 validation error:\n  {err}\n\n{where}")


def add_routes(app: FastAPI, state: ServerState) -> None:
    """Register the OpenAI-compatible routes on ``app``."""
    # --v1-models-id: a server whose /v1/models names another model than /model_info and /server_info
    model_id = state.args.v1_models_id or state.args.served_model_name or state.args.model_path

    @app.get("/v1/models")
    async def available_models() -> Response:
        card = {
            "id": model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "sglang",
            "root": model_id,
            "parent": None,
            "max_model_len": state.context_length,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def openai_v1_completions(request: Request) -> Response:
        hang = state.count_generation(request)
        try:
            body = await request.json()
        except ValueError as e:
            return openai_error(f"Invalid JSON: {e}")
        if not isinstance(body, dict) or body.get("prompt") is None:
            body = body if isinstance(body, dict) else {}
            return missing_field(body, "prompt", "openai_v1_completions", "/v1/completions")
        raw = body["prompt"]
        if isinstance(raw, str):
            prompts = [state.tokenizer.encode(raw)]
        elif raw and all(isinstance(p, str) for p in raw):
            prompts = [state.tokenizer.encode(p) for p in raw]
        elif raw and all(isinstance(t, int) for t in raw):
            prompts = [list(raw)]
        elif raw and all(isinstance(p, list) for p in raw):
            prompts = [list(p) for p in raw]
        else:
            return openai_error("prompt must be a string, a list of strings or a list of token ids.")
        return await _complete(state, request, body, prompts, chat=False, hang=hang, default_max=16)

    @app.post("/v1/chat/completions")
    async def openai_v1_chat_completions(request: Request) -> Response:
        hang = state.count_generation(request)
        try:
            body = await request.json()
        except ValueError as e:
            return openai_error(f"Invalid JSON: {e}")
        if not isinstance(body, dict) or body.get("messages") is None:
            body = body if isinstance(body, dict) else {}
            return missing_field(body, "messages", "openai_v1_chat_completions", "/v1/chat/completions")
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return openai_error("messages must be a list of objects.")
        prompt = state.tokenizer.encode(apply_chat_template(messages))
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        return await _complete(state, request, {**body, "max_tokens": max_tokens}, [prompt], chat=True,
                               hang=hang, default_max=None)  # fmt: skip


async def _complete(
    state: ServerState,
    request: Request,
    body: dict[str, Any],
    prompts: list[list[int]],
    *,
    chat: bool,
    hang: bool,
    default_max: int | None,
) -> Response:
    """Both OpenAI endpoints: n choices per prompt, stream or not, usage, logprobs on NONE."""
    # --inject ignore-tools / tools-greedy-only: a server that drops tools and tool_choice
    if chat and _tools_ignored(state, body):
        body = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
        body["ignore_eos"] = body.get("ignore_eos") or "ignore-tools" in state.faults  # rambles to max_tokens
    raw = {dst: body[src] for src, dst in OPENAI_SAMPLING.items() if body.get(src) is not None}
    raw["max_new_tokens"] = body.get("max_tokens", default_max) if "max_tokens" in body else default_max
    n = body.get("n") or 1
    want_logprobs = bool(body.get("logprobs"))
    top_n = int(body.get("top_logprobs") or 0) if chat else int(body.get("logprobs") or 0)
    try:
        for param in GRAMMAR_KINDS:  # SGLang's chat request takes these as extra fields too
            if body.get(param) is not None:
                raw[param] = body[param]
        tool_schema = None
        if chat:
            try:
                schema = response_format_schema(body.get("response_format"))
                tool_schema = tool_call_schema(body.get("tools"), body.get("tool_choice"))
            except InvalidGrammar as e:
                raise BadRequest(str(e)) from None
            if schema is not None:
                raw["json_schema"] = schema
            if tool_schema is not None:  # a forced call: SGLang constrains the output to the call's schema
                raw["json_schema"] = tool_schema
        if not isinstance(n, int) or n < 1:
            raise BadRequest(f"n must be at least 1, got {n}.")
        if want_logprobs and state.spec:
            raise BadRequest(LOGPROB_REFUSED)
        all_prompts, all_params = [], []
        for prompt in prompts:
            if not prompt:
                raise BadRequest("The input is empty.")
            params = parse_sampling_params(raw, context_length=state.context_length, prompt_len=len(prompt))
            params.reasoning = chat and require_reasoning(state.args.reasoning_parser, body)
            check_grammar(params, state.engine.grammar)
            for i in range(n):
                seed = state.seed_for(params.sampling_seed, i)
                all_prompts.append(prompt)
                all_params.append(SamplingParams(**{**params.__dict__, "sampling_seed": seed}))
    except BadRequest as e:
        if chat and body.get("stream") and str(e) == NO_BACKEND:
            # SGLang's scheduler refuses the grammar after serving_chat began the stream: HTTP 200, an error
            # event with code 400, the usage chunk (nothing counted) when asked, [DONE]
            return StreamingResponse(_refused_stream(str(e), body), media_type="text/event-stream")
        return openai_error(str(e))
    top = top_n if want_logprobs else -1
    batch = state.new_batch(all_prompts, all_params, hang=hang, top_logprobs_num=top,
                            stream=bool(body.get("stream")))
    meta = {
        "id": uuid.uuid4().hex,
        "created": int(time.time()),
        "model": body.get("model", "default"),
        "chat": chat,
        "n": n,
        "include_usage": bool((body.get("stream_options") or {}).get("include_usage")),
        # the reasoning parser a chat stream splits by (SGLang: stream_reasoning, the default)
        "reasoning_parser": state.args.reasoning_parser if chat and body.get("separate_reasoning", True)
        else None,
        # a forced call streams as tool-call deltas (SGLang's JsonArrayParser) where a parser is set
        "tool_names": tuple(str((t.get("function") or {}).get("name")) for t in body["tools"])
        if tool_schema is not None and state.args.tool_call_parser else None,
    }
    if body.get("stream"):
        batch.streaming = True
        return StreamingResponse(_stream(state, batch, meta), media_type="text/event-stream")
    await batch.wait()
    choices = []
    for i, gen in enumerate(batch.gens):
        assert gen.last is not None
        text = state.text_of(gen, gen.last, final=True)
        choice: dict[str, Any] = {"index": i}
        reason, matched = _finish(gen.last)
        if chat:
            forced = tool_schema is not None and state.args.tool_call_parser is not None
            choice["message"], reason = _chat_message(state, body, text, reason, forced=forced,
                                                      reasoning=gen.req.params.reasoning)
        else:
            choice["text"] = text
        choice["logprobs"] = _logprobs(state, gen, chat) if want_logprobs else None
        # SGLang's _process_tool_calls: a stop that became "tool_calls" matched nothing (a stream keeps it)
        choice["finish_reason"], choice["matched_stop"] = reason, None if reason == "tool_calls" else matched
        choices.append(choice)
    usage = _usage(batch, n, details=True)
    obj = "chat.completion" if chat else "text_completion"
    response = {"id": meta["id"], "object": obj, "created": meta["created"], "model": meta["model"],
                "choices": choices, "usage": usage, "metadata": {"weight_version": "default"}}  # fmt: skip
    payload = dumps(response)
    if "bad-json" in state.faults:
        payload = corrupt(payload)
    return Response(payload, media_type="application/json")


def _chat_message(state: ServerState, body: dict[str, Any], text: str, reason: str | None, *,
                  forced: bool, reasoning: bool) -> tuple[dict[str, Any], str | None]:
    """The assistant message (reasoning, content, tool calls) and the finish reason, as SGLang serves chat.

    A constrained request that reasons was free up to </think> and constrained after it (structured.py's
    ThinkPhase), so its content, and a forced call's array, is the part after the split. `forced`: a forced
    call under --tool-call-parser (without one, SGLang 0.5.17 parses no calls: the array is the content)."""
    thought = None
    if body.get("separate_reasoning", True):
        thought, text = split_reasoning(text, state.args.reasoning_parser, force=reasoning)
    calls: list[dict[str, Any]] = []
    if forced and reason == "stop":
        calls = tool_calls_from_constrained(text) or []
    elif forced and reason == "length":  # SGLang 0.5.17 parses the cut call: its name, arguments "null"
        calls = tool_calls_cut(text)
        text = "" if calls else text
    elif body.get("tools") and body.get("tool_choice") != "none":
        text, calls = parse_tool_calls(text, state.args.tool_call_parser)
    content = None if forced and calls and reason != "length" else text  # a cut call: "" (recorded)
    message: dict[str, Any] = {"role": "assistant", "content": content,
                               "reasoning_content": thought, "tool_calls": calls or None}  # fmt: skip
    return message, "tool_calls" if calls and reason == "stop" else reason


async def _stream(state: ServerState, batch: Batch, meta: dict[str, Any]) -> AsyncIterator[str]:
    """OpenAI SSE chunks; chat opens each choice with a role chunk; usage last if asked; [DONE]."""
    chat = meta["chat"]
    obj = "chat.completion.chunk" if chat else "text_completion"
    sent = [""] * len(batch.gens)
    parser = meta.get("reasoning_parser")
    sent_parts = [("", "")] * len(batch.gens)  # (reasoning_content, content) streamed so far
    names = meta.get("tool_names")
    tool_streams = [ToolCallStream(names) for _ in batch.gens] if names is not None else None
    truncate = "truncated-stream" in state.faults

    def event(choices: list[dict[str, Any]], usage: object = None, with_usage_key: bool = not chat) -> str:
        chunk: dict[str, Any] = {"id": meta["id"], "object": obj, "created": meta["created"],
                                 "model": meta["model"], "choices": choices}  # fmt: skip
        if with_usage_key or usage is not None:
            chunk["usage"] = usage
        payload = dumps(chunk)
        return f"data: {corrupt(payload) if 'bad-json' in state.faults else payload}\n\n"

    def content_events(i: int, content: str, final: bool) -> Iterator[str]:
        """A chat choice's content: as it is, or through the forced call's parser (SGLang's pydantic chunks:
        every field of the delta, `usage` null)."""
        if tool_streams is None:
            if content or not final:
                yield event([_chunk_choice(i, {"reasoning_content": None, "content": content}, None, None,
                                           chat)])  # fmt: skip
            return
        stream = tool_streams[i]
        plain, calls = stream.feed(content)
        rest = stream.unsent() if final else None
        empty: dict[str, Any] = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
        deltas = [{**empty, "content": plain}] if plain else []
        deltas += [{**empty, "tool_calls": [call]} for call in [*calls, *([rest] if rest else [])]]
        for delta in deltas:
            yield event([_chunk_choice(i, delta, None, None, chat)], with_usage_key=True)

    try:
        if chat:
            for i in range(len(batch.gens)):
                delta = {"reasoning_content": None, "role": "assistant", "content": ""}
                yield event([_chunk_choice(i, delta, None, None, chat)])
        async for i, out in batch.events():
            gen = batch.gens[i]
            final = out.finish is not None
            if truncate and (final or len(out.output_ids) * 2 >= gen.req.params.max_new_tokens):
                return  # the truncated-stream fault: no final chunk, no [DONE]
            text = state.text_of(gen, out, final=final)
            text = text if final else _hold_back(text, gen)
            delta_text = text[len(sent[i]) :] if text.startswith(sent[i]) else ""
            sent[i] = text if text.startswith(sent[i]) else sent[i]
            reason, matched = _finish(out) if final else (None, None)
            if chat and parser is not None:
                thought, content = split_reasoning(text, parser, force=gen.req.params.reasoning,
                                                   partial=not final)
                new = [_grown(before, now) for before, now in zip(sent_parts[i], (thought or "", content),
                                                                   strict=True)]  # fmt: skip
                sent_parts[i] = (sent_parts[i][0] + new[0], sent_parts[i][1] + new[1])
                if new[0]:
                    yield event([_chunk_choice(i, {"reasoning_content": new[0], "content": None}, None, None,
                                               chat)])  # fmt: skip
                if new[1] or tool_streams is not None:  # SGLang hands the parser every step's delta
                    for chunk in content_events(i, new[1], final):
                        yield chunk
                if final:
                    finish = _called(reason, tool_streams, i)
                    yield event([_chunk_choice(i, {"reasoning_content": None}, finish, matched, chat)])
            elif chat:
                for chunk in content_events(i, delta_text, final):
                    yield chunk
                if final:
                    finish = _called(reason, tool_streams, i)
                    yield event([_chunk_choice(i, {"reasoning_content": None}, finish, matched, chat)])
            else:
                yield event([_chunk_choice(i, delta_text, reason, matched, chat)])
        if meta["include_usage"]:
            yield event([], _usage(batch, meta["n"], details=chat), with_usage_key=True)
        yield "data: [DONE]\n\n"
    finally:
        batch.abort()


def _tools_ignored(state: ServerState, body: dict[str, Any]) -> bool:
    """Whether a fault makes this chat's tools and tool_choice go unread."""
    if "ignore-tools" in state.faults:
        return True
    return "tools-greedy-only" in state.faults and float(body.get("temperature") or 0) > 0


async def _refused_stream(message: str, body: dict[str, Any]) -> AsyncIterator[str]:
    error = {"object": "error", "message": message, "type": "BAD_REQUEST", "param": None, "code": 400}
    yield f"data: {dumps({'error': error})}\n\n"
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0, "prompt_tokens_details": None,
                 "reasoning_tokens": 0}
        chunk = {"id": uuid.uuid4().hex, "object": "chat.completion.chunk", "created": int(time.time()),
                 "model": body.get("model", "default"), "choices": [], "usage": usage}
        yield f"data: {dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def _called(reason: str | None, tool_streams: list[ToolCallStream] | None, i: int) -> str | None:
    """The finish reason a choice streams: "tool_calls" for a natural stop after tool-call deltas."""
    called = tool_streams is not None and tool_streams[i].called
    return "tool_calls" if called and reason == "stop" else reason


def _grown(sent: str, now: str) -> str:
    """What a stream has not sent yet of a part that only grows; '' when it did not grow."""
    return now[len(sent) :] if now.startswith(sent) else ""


def _chunk_choice(i: int, delta: object, reason: str | None, matched: object, chat: bool) -> dict[str, Any]:
    if chat:
        return {"index": i, "delta": delta, "logprobs": None, "finish_reason": reason,
                "matched_stop": matched}
    return {"index": i, "text": delta, "logprobs": None, "finish_reason": reason, "matched_stop": matched}


def _hold_back(text: str, gen: Gen) -> str:
    """Never stream text that may turn out to be (the start of) a stop string."""
    for stop in gen.req.params.stop:
        if stop and (pos := text.find(stop)) != -1:
            text = text[:pos]
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                text = text[:-k]
                break
    return text


def _finish(out: Output) -> tuple[str | None, object]:
    finish = out.finish or {}
    kind = finish.get("type")
    reason = {"stop": "stop", "length": "length", "abort": "abort"}.get(str(kind)) if kind else None
    return reason, finish.get("matched")


def _usage(batch: Batch, n: int, *, details: bool) -> dict[str, Any]:
    prompt = sum(g.prompt_tokens for g in batch.gens[::n])
    completion = sum(len(g.last.output_ids) for g in batch.gens if g.last is not None)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion}
    usage["completion_tokens"] = completion
    if details:
        usage["prompt_tokens_details"] = None
    usage["reasoning_tokens"] = 0
    return usage


def _logprobs(state: ServerState, gen: Gen, chat: bool) -> dict[str, Any]:
    """OpenAI logprobs (NONE servers only): per token, and its top alternatives."""

    def piece(tok: int) -> str:
        return state.tokenizer.decode([tok], skip_special_tokens=False)

    if chat:
        content = [
            {
                "token": piece(tok),
                "logprob": lp,
                "bytes": list(piece(tok).encode()),
                "top_logprobs": [{"token": piece(t), "logprob": v, "bytes": list(piece(t).encode())}
                                 for v, t in top],
            }
            for lp, tok, top in gen.logprobs
        ]
        return {"content": content}
    offsets, pos = [], 0
    for _, tok, _ in gen.logprobs:
        offsets.append(pos)
        pos += len(piece(tok))
    return {
        "tokens": [piece(tok) for _, tok, _ in gen.logprobs],
        "token_logprobs": [lp for lp, _, _ in gen.logprobs],
        "top_logprobs": [{piece(t): v for v, t in top} for _, _, top in gen.logprobs],
        "text_offset": offsets,
    }
