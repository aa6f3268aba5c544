"""The HTTP server: SGLang 0.5.17's routes on FastAPI/uvicorn in front of the scheduler thread.

Start-up follows SGLang: log the server args, load the model, allocate the KV pool, bind, serve,
then a warm-up request through HTTP; /health_generate answers 503 until it has finished. The native
routes live here, the OpenAI ones in openai_api.py.
"""

from __future__ import annotations

# SGLang's HTTP server imports its transcription routes first (and with them soundfile).
from pytest_dflash.refserver import transcription  # noqa: F401  # isort: skip

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import time
import traceback
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pytest_dflash.refserver import faults
from pytest_dflash.refserver.logs import setup_logging, uvicorn_log_config
from pytest_dflash.refserver.metrics import Metrics
from pytest_dflash.refserver.model import ByteTokenizer, ModelConfig, TinyLM
from pytest_dflash.refserver.scheduler import Output, Scheduler
from pytest_dflash.refserver.scheduler import Request as GenRequest
from pytest_dflash.refserver.server_args import ServerArgs
from pytest_dflash.refserver.spec import SAMPLING_EPS, Engine, SamplingParams

__all__ = ["BadRequest", "Batch", "ServerState", "build_app", "launch_server"]

logger = logging.getLogger("pytest_dflash.refserver")

SGLANG_VERSION = "0.5.17"
WARMUP_HEADER = "x-refserver-warmup"  # keeps the warm-up request out of the hang/oom-kill counts
GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
    "requests, the operation will not be performed.)\n"
)
SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "sampling_seed", "n", "no_stop_trim", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "spaces_between_special_tokens", "stop_regex", "custom_params",
    "json_schema", "regex", "ebnf", "structural_tag", "logit_bias",
}  # fmt: skip


class BadRequest(Exception):
    """A request SGLang would answer with HTTP 400; the message is SGLang's."""


# --- requests -------------------------------------------------------------------------------------


def parse_sampling_params(raw: object, *, context_length: int, prompt_len: int) -> SamplingParams:
    """SGLang's SamplingParams: normalise, then verify(), with its error messages."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest("sampling_params must be an object.")
    for key in raw:
        if key not in SAMPLING_KEYS:
            raise BadRequest(f"SamplingParams.__init__() got an unexpected keyword argument '{key}'")
    if any(raw.get(k) is not None for k in ("json_schema", "regex", "ebnf", "structural_tag")):
        raise BadRequest("Constrained decoding (json_schema, regex, ebnf, structural_tag) is not supported.")
    temperature = raw.get("temperature", 1.0)
    top_p, top_k, min_p = raw.get("top_p", 1.0), raw.get("top_k", -1), raw.get("min_p", 0.0)
    max_new = raw.get("max_new_tokens", 128)
    n = raw.get("n", 1)
    number = (int, float)
    if not isinstance(temperature, number) or not math.isfinite(temperature) or temperature < 0:
        raise BadRequest(f"temperature must be a non-negative finite number, got {temperature}.")
    if not isinstance(top_p, number) or not 0.0 < top_p <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}.")
    if not isinstance(min_p, number) or not 0.0 <= min_p <= 1.0:
        raise BadRequest(f"min_p must be in [0, 1], got {min_p}.")
    if isinstance(temperature, number) and 0 <= temperature < SAMPLING_EPS:
        top_k = 1  # SGLang rewrites greedy to top_k=1 before verifying, so top_k=0 at temperature 0 is accepted
    if not isinstance(top_k, int) or (top_k < 1 and top_k != -1):
        raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
        raise BadRequest(f"max_new_tokens must be at least 0, got {max_new}.")
    if not isinstance(n, int) or n < 1:
        raise BadRequest(f"n must be at least 1, got {n}.")
    if prompt_len >= context_length:
        raise BadRequest(
            f"The input ({prompt_len} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    asked = raw.get("max_new_tokens")  # SGLang checks the total only when max_new_tokens was given
    if asked is not None and asked + prompt_len >= context_length:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {asked + prompt_len} tokens: {prompt_len} tokens from the input "
            f"messages and {asked} tokens for the completion. Please reduce the number of tokens in the "
            "input messages or the completion to fit within the limit."
        )
    if max_new is None:  # OpenAI chat without max_tokens: up to the context length
        max_new = context_length - prompt_len
    stop = raw.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    stop_ids = raw.get("stop_token_ids") or []
    if not all(isinstance(s, str) for s in stop) or not all(isinstance(t, int) for t in stop_ids):
        raise BadRequest("stop must be a string or a list of strings; stop_token_ids a list of integers.")
    seed = raw.get("sampling_seed")
    if seed is not None and not isinstance(seed, int):
        raise BadRequest(f"sampling_seed must be an integer, got {seed}.")
    temperature = float(temperature)
    if temperature < SAMPLING_EPS:
        temperature, top_k = 1.0, 1  # SGLang: temperature 0 means greedy
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=temperature,
        top_p=float(top_p),
        top_k=top_k,
        min_p=float(min_p),
        stop=list(stop),
        stop_token_ids=list(stop_ids),
        ignore_eos=bool(raw.get("ignore_eos", False)),
        skip_special_tokens=bool(raw.get("skip_special_tokens", True)),
        sampling_seed=seed,
        n=n,
    )


@dataclass(eq=False)
class Gen:
    """One sequence of one HTTP request, as the HTTP side tracks it."""

    req: GenRequest
    prompt_tokens: int
    received: float
    last: Output | None = None
    first_token_at: float | None = None
    first_sent: float | None = None  # when the first streamed event went out
    logprobs: list[tuple[float, int, list[tuple[float, int]]]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.last is not None and self.last.finish is not None


class Batch:
    """The sequences of one HTTP request; their outputs arrive on one queue, in any order."""

    def __init__(self, state: ServerState, gens: list[Gen], queue: asyncio.Queue[tuple[int, Output]]) -> None:
        self.state, self.gens, self.queue = state, gens, queue
        self.streaming = False

    async def events(self) -> AsyncIterator[tuple[int, Output]]:
        """Yield (index, output) until every sequence has finished."""
        while not all(g.done for g in self.gens):
            i, out = await self.queue.get()
            gen = self.gens[i]
            gen.first_token_at = out.first_token_time or None
            gen.last = out
            gen.logprobs = out.logprobs
            if out.finish is not None and gen.req.log_metrics:
                self.state.record_finished(gen, streaming=self.streaming)
            yield i, out

    async def wait(self) -> None:
        async for _ in self.events():
            pass

    def abort(self) -> None:
        for g in self.gens:
            g.req.aborted = True


class ServerState:
    """Everything the routes share."""

    def __init__(self, args: ServerArgs, engine: Engine, scheduler: Scheduler) -> None:
        self.args, self.engine, self.scheduler = args, engine, scheduler
        self.faults = faults.active()
        self.tokenizer = ByteTokenizer()
        self.context_length = args.effective_context_length
        self.spec = engine.algorithm != "NONE"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = False  # set by the warm-up; /health_generate is 503 before
        self.gracefully_exit = False
        self.created = int(time.time())
        self.startup_seconds: dict[str, float] = {}
        self.generation_requests = 0  # the hang fault counts these
        self.completed_generations = 0  # the oom-kill fault counts these
        self.seed_rng = np.random.default_rng(args.random_seed)
        self.metrics = Metrics(args.served_model_name or args.model_path)
        self.health_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))

    def new_batch(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        *,
        log_metrics: bool = True,
        hang: bool = False,
        top_logprobs_num: int = -1,
        stream: bool = False,
    ) -> Batch:
        """Submit one sequence per (prompt, params) pair to the scheduler."""
        assert self.loop is not None
        loop, queue = self.loop, asyncio.Queue[tuple[int, Output]]()
        gens = []
        now = time.time()
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            seed = p.sampling_seed if p.sampling_seed is not None else int(self.seed_rng.integers(2**31))

            def deliver(out: Output, i: int = i) -> None:
                with contextlib.suppress(RuntimeError):  # the loop is gone: shutting down
                    loop.call_soon_threadsafe(queue.put_nowait, (i, out))

            req = GenRequest(
                uuid.uuid4().hex, prompt, p, seed, deliver, log_metrics, hang, top_logprobs_num, stream=stream
            )
            gens.append(Gen(req, len(prompt), now))
        for g in gens:
            self.scheduler.submit(g.req)
        return Batch(self, gens, queue)

    @property
    def last_receive(self) -> float:
        """When the scheduler last produced a token (SGLang's tokenizer manager: last_receive_tstamp)."""
        return self.scheduler.last_output

    def count_generation(self, request: Request) -> bool:
        """Count a user generation request; True if it is the one the hang fault swallows."""
        if request.headers.get(WARMUP_HEADER):
            return False
        self.generation_requests += 1
        return "hang" in self.faults and self.generation_requests == int(self.faults.value("hang"))

    def seed_for(self, seed: int | None, i: int) -> int | None:
        """The seed of the i-th of n samples: seed, seed + 1, ... so that they differ."""
        return None if seed is None else seed + i

    def record_finished(self, gen: Gen, *, streaming: bool) -> None:
        assert gen.last is not None
        now = time.time()
        first = gen.first_token_at or now
        self.metrics.finished(
            streaming=streaming,
            prompt=gen.prompt_tokens,
            generated=len(gen.last.output_ids),
            ttft=first - gen.received,
            e2e=now - gen.received,
        )

    def text_of(self, gen: Gen, out: Output, *, final: bool) -> str:
        """Decoded output; at the end trimmed at the matched stop (SGLang's trim_matched_stop)."""
        ids = out.output_ids
        matched = (out.finish or {}).get("matched")
        if final and isinstance(matched, int) and matched and ids:
            ids = ids[:-1]
        skip = gen.req.params.skip_special_tokens
        text = self.tokenizer.decode(ids, skip_special_tokens=skip) if final else self.tokenizer.decode_complete(ids)
        if final and isinstance(matched, str) and (pos := text.find(matched)) != -1:
            text = text[:pos]
        return text

    def meta_info(self, gen: Gen, out: Output, *, final: bool, logprobs: bool, stream: bool = False) -> dict[str, Any]:
        """meta_info in the field order of the recorded SGLang 0.5.17 responses (streamed ones too)."""
        stats = out.stats
        meta: dict[str, Any] = {
            "id": gen.req.rid,
            "finish_reason": out.finish,
            "prompt_tokens": gen.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "forward_entry_time": gen.received,
            "prefill_finished_time": out.prefill_finished,
            "queue_time": max(0.0, out.prefill_finished - gen.received) / 10,
        }
        if logprobs:
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok, _ in gen.logprobs]
            meta["output_token_logprobs_length"] = len(gen.logprobs)
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = [[[lp, tok, None] for lp, tok in top] for _, _, top in gen.logprobs]
        meta.update(
            reasoning_tokens=0,
            completion_tokens=len(out.output_ids),
            cached_tokens=0,
            cached_tokens_details=None,
            dp_rank=None,
        )
        now = time.time()
        if not final:
            if stream and gen.first_sent is None:  # SGLang stamps the first streamed event only
                gen.first_sent = now
                meta["response_sent_to_client_ts"] = now
            return meta
        meta["e2e_latency"] = now - gen.received
        if self.spec and stats.verify_ct > 0:
            meta.update(
                spec_accept_rate=stats.accepted_drafts / stats.proposed_drafts if stats.proposed_drafts else 0.0,
                spec_accept_length=len(out.output_ids) / stats.verify_ct,
                spec_num_correct_drafts=stats.accepted_drafts,
                spec_num_proposed_drafts=stats.proposed_drafts,
                spec_verify_ct=stats.verify_ct,
                spec_accepted_drafts=stats.accepted_drafts,
                spec_proposed_drafts=stats.proposed_drafts,
                spec_correct_drafts_histogram=list(stats.histogram),
                spec_accept_histogram=list(stats.histogram),
            )
        meta.update(request_received_ts=gen.received, api_server_dispatch_finish_ts=gen.received)
        if stream:
            meta["response_sent_to_client_ts"] = gen.first_sent or now
        meta["request_finished_ts"] = now
        meta["decode_throughput"] = max(len(out.output_ids) - 1, 0) / max(now - out.prefill_finished, 1e-9)
        if not stream:
            meta["response_sent_to_client_ts"] = now
        return meta

    async def graceful_exit(self) -> None:
        """SIGTERM: drain, then end the way SGLang does (kill_process_tree: exit status 137)."""
        if self.gracefully_exit:
            return
        logger.info("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        self.gracefully_exit = True
        deadline = time.monotonic() + 5.0
        while self.scheduler.busy_rids() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        rids = self.scheduler.busy_rids()
        logger.info(
            "Gracefully exiting... Remaining number of requests %d. Remaining requests remaining_rids=%s.",
            len(rids), rids,
        )  # fmt: skip
        faults.kill_process_tree(include_parent=True)


def error_json(message: str, status: int = 400) -> JSONResponse:
    """SGLang's native error body."""
    logger.error("[http_server] Error: %s", message)
    return JSONResponse({"error": {"message": message}}, status_code=status)


def corrupt(payload: str) -> str:
    """The bad-json fault: the body is cut short, so it no longer parses."""
    return payload[: max(1, len(payload) * 2 // 3)]


def dumps(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# --- the app --------------------------------------------------------------------------------------


def build_app(state: ServerState) -> FastAPI:
    """All routes; OpenAI ones are added by openai_api.add_routes."""
    from pytest_dflash.refserver import openai_api

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.state.refserver = state
    args = state.args

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.middleware("http")
    async def outer(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        open_path = request.method == "OPTIONS" or path.startswith(("/health", "/metrics"))
        authorized = request.headers.get("authorization") == f"Bearer {args.api_key}"
        if args.api_key is not None and not open_path and not authorized:
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        key = (path, request.method)
        state.metrics.http_requests[key] = state.metrics.http_requests.get(key, 0) + 1
        response = await call_next(request)
        rkey = (path, request.method, response.status_code)
        state.metrics.http_responses[rkey] = state.metrics.http_responses.get(rkey, 0) + 1
        if path in GENERATION_PATHS and response.status_code == 200 and not request.headers.get(WARMUP_HEADER):
            state.completed_generations += 1
            if "oom-kill" in state.faults and state.completed_generations >= state.faults.value("oom-kill"):
                response = _kill_after_response(response)  # like the OOM killer: no log line
        return response

    @app.api_route("/health", methods=["GET"])
    @app.api_route("/health_generate", methods=["GET"])
    async def health_generate(request: Request) -> Response:
        """200 once a real 1-token greedy generation answers within SGLANG_HEALTH_CHECK_TIMEOUT."""
        if state.gracefully_exit:
            logger.info("Health check request received during shutdown. Returning 503.")
            return Response(status_code=503)
        if not state.ready:
            return Response(status_code=503)
        params = SamplingParams(max_new_tokens=1, temperature=1.0, top_k=1)
        batch = state.new_batch([[0]], [params], log_metrics=False)
        tic = time.time()
        try:
            while time.time() < tic + state.health_timeout:
                await asyncio.sleep(0.02)
                if state.last_receive > tic:
                    return Response(status_code=200)
        finally:
            batch.abort()
        logger.error(
            "Health check failed. Server couldn't get a response from detokenizer for last %g seconds. "
            "tic start time: %s. last_heartbeat time: %s",
            state.health_timeout, time.strftime("%H:%M:%S", time.localtime(tic)),
            time.strftime("%H:%M:%S", time.localtime(state.last_receive)),
        )  # fmt: skip
        return Response(status_code=503)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info(request: Request) -> Response:
        if request.url.path == "/get_model_info":
            logger.info("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                        "Please use '/model_info' instead.")  # fmt: skip
        return JSONResponse(
            {
                "model_path": args.model_path,
                "tokenizer_path": args.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "refserver_tiny",
                "architectures": ["RefTinyForCausalLM"],
            }
        )

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info(request: Request) -> Response:
        if request.url.path == "/get_server_info":
            logger.info("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                        "Please use '/server_info' instead.")  # fmt: skip
        server_args = args.as_dict()
        internal = {
            **server_args,
            "max_speculative_num_draft_tokens": args.block_size if state.spec else None,
            "last_gen_throughput": state.scheduler.last_gen_throughput,
            "memory_usage": {
                "weight": _weights_gb(state.engine.target),
                "kvcache": 0.0,
                "token_capacity": state.scheduler.max_running * state.context_length,
            },
            "startup_time": state.startup_seconds,
            "effective_max_running_requests_per_dp": state.scheduler.max_running,
        }
        if state.spec:
            internal["avg_spec_accept_length"] = state.scheduler.totals.avg_accept_length
        return JSONResponse(
            {
                **server_args,
                "status": "ready" if state.ready else "starting",
                "max_total_num_tokens": state.scheduler.max_running * state.context_length,
                "max_req_input_len": state.context_length - 1,
                "startup_time": state.startup_seconds,
                "internal_states": [internal],
                "version": SGLANG_VERSION,
                "kv_events": None,
            }
        )

    @app.get("/get_load")
    async def get_load() -> Response:
        logger.info("Endpoint '/get_load' is deprecated and will be removed in a future version. "
                    "Please use '/v1/loads' instead.")  # fmt: skip
        load = state.scheduler.load()
        return JSONResponse([{"dp_rank": 0, **load, "num_pending_tokens": 0, "ts_tic": time.monotonic()}])

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = await asyncio.wrap_future(state.scheduler.flush_cache())
        return Response(FLUSH_CACHE_TEXT, status_code=200 if ok else 400)

    if args.enable_metrics:

        @app.get("/metrics")
        async def metrics() -> Response:
            sched = state.scheduler
            gauges = {
                "max_total_num_tokens": float(sched.max_running * state.context_length),
                "page_size": 1.0,
                "context_len": float(state.context_length),
                "num_running_reqs": float(len(sched.running) + len(sched.parked)),
                "num_queue_reqs": float(len(sched.waiting)),
                "gen_throughput": sched.last_gen_throughput,
            }
            body = state.metrics.render(spec=state.spec, verify_calls=sched.verify_calls_total, gauges=gauges)
            return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        hang = state.count_generation(request)
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("The request body must be a JSON object.")
            prompts, params, single = _generate_inputs(state, body)
            top_n = -1
            if body.get("return_logprob"):
                if state.spec:
                    algo = state.engine.algorithm
                    msg = f"{algo} speculative decoding does not support return_logprob yet."
                    logger.info("%s, self.rid=%r", msg, uuid.uuid4().hex)
                    raise BadRequest(msg)
                top_n = int(body.get("top_logprobs_num") or 0)
        except BadRequest as e:
            return error_json(str(e))
        except (ValueError, TypeError) as e:
            return error_json(f"Invalid request: {e}")
        batch = state.new_batch(prompts, params, hang=hang, top_logprobs_num=top_n, stream=bool(body.get("stream")))
        if body.get("stream"):
            batch.streaming = True
            return StreamingResponse(_generate_stream(state, batch, single, top_n >= 0), media_type="text/event-stream")
        await batch.wait()
        results = [
            {
                "text": state.text_of(g, g.last, final=True),
                "output_ids": g.last.output_ids,
                "meta_info": state.meta_info(g, g.last, final=True, logprobs=top_n >= 0),
            }
            for g in batch.gens
            if g.last is not None
        ]
        payload = dumps(results[0] if single else results)
        if "bad-json" in state.faults:
            payload = corrupt(payload)
        return Response(payload, media_type="application/json")

    openai_api.add_routes(app, state)
    return app


def _generate_inputs(state: ServerState, body: dict[str, Any]) -> tuple[list[list[int]], list[SamplingParams], bool]:
    """Prompts and sampling params of a native /generate body (single, batch, or n > 1)."""
    if body.get("text") is not None:
        texts = body["text"]
        single = isinstance(texts, str)
        prompts = [state.tokenizer.encode(t) for t in ([texts] if single else texts)]
    elif body.get("input_ids") is not None:
        ids = body["input_ids"]
        single = bool(ids) and isinstance(ids[0], int)
        prompts = [list(ids)] if single else [list(x) for x in ids]
    else:
        raise BadRequest("Either text or input_ids should be provided.")
    for prompt in prompts:
        if not prompt:
            raise BadRequest("The input is empty.")
        if any(not isinstance(t, int) or not 0 <= t < state.tokenizer.vocab_size for t in prompt):
            raise BadRequest(f"Input token ids must be in [0, {state.tokenizer.vocab_size}).")
    raw = body.get("sampling_params")
    raws = raw if isinstance(raw, list) else [raw] * len(prompts)
    if len(raws) != len(prompts):
        raise BadRequest("The number of sampling_params must match the number of prompts.")
    out_prompts, out_params = [], []
    for prompt, r in zip(prompts, raws, strict=True):
        params = parse_sampling_params(r, context_length=state.context_length, prompt_len=len(prompt))
        for i in range(params.n):
            seed = state.seed_for(params.sampling_seed, i)
            out_prompts.append(prompt)
            out_params.append(SamplingParams(**{**params.__dict__, "sampling_seed": seed, "n": 1}))
    return out_prompts, out_params, single and len(out_prompts) == 1


async def _generate_stream(state: ServerState, batch: Batch, single: bool, logprobs: bool) -> AsyncIterator[str]:
    """/generate SSE: cumulative text and ids per step, the full meta_info at the end, then [DONE]."""
    truncate = "truncated-stream" in state.faults
    try:
        async for i, out in batch.events():
            gen = batch.gens[i]
            final = out.finish is not None
            if truncate and (final or len(out.output_ids) * 2 >= gen.req.params.max_new_tokens):
                return  # the truncated-stream fault: the stream just ends, no final event, no [DONE]
            item: dict[str, Any] = {
                "text": state.text_of(gen, out, final=final),
                "output_ids": out.output_ids,
                "meta_info": state.meta_info(gen, out, final=final, logprobs=logprobs, stream=True),
            }
            if not single:
                item["index"] = i
            payload = dumps(item)
            yield f"data: {corrupt(payload) if 'bad-json' in state.faults else payload}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        batch.abort()


def _kill_after_response(response: Response) -> Response:
    """Send the response, then SIGKILL this process (the oom-kill fault)."""
    from starlette.background import BackgroundTask

    async def kill() -> None:
        await asyncio.sleep(0.05)
        faults.kill_self()

    response.background = BackgroundTask(kill)
    return response


# --- start-up -------------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: SIGTERM drains the SGLang way (ServerState.graceful_exit)."""

    announced = False

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets:  # uvicorn stays quiet for pre-bound sockets; tools parse this line for the port
            self._log_started_message(sockets)
        self.announced = True


def launch_server(args: ServerArgs) -> None:
    """Load, bind, serve until killed (SGLang ends by SIGKILLing itself; so does this)."""
    setup_logging(args.log_level)
    torch.set_num_threads(1)  # a shared 2-core machine: one core for the model is plenty
    logger.info(args.log_line())
    t0 = time.monotonic()
    config = ModelConfig(context_length=args.effective_context_length)
    logger.info("Load weight begin. avail mem=%.2f GB", _avail_mem_gb())
    target = TinyLM(config, args.model_seed)
    load_s = time.monotonic() - t0
    logger.info(
        "Load weight end. elapsed=%.2f s, type=RefTinyForCausalLM, avail mem=%.2f GB, mem usage=%.2f GB.",
        load_s, _avail_mem_gb(), _weights_gb(target),
    )  # fmt: skip
    algo = args.speculative_algorithm or "NONE"
    active = faults.active()
    if algo != "NONE":
        logger.info(
            "Initialized %s draft runner. attention_backend=%s, model=EarlyExitDraftModel, block_size=%d, "
            "draft_window_size=None, compact_cache=False",
            algo, args.attention_backend, args.block_size,
        )  # fmt: skip
        if "greedy-fallback" in active:
            logger.warning(
                "DFLASH non-greedy verification is unavailable on this build/device; "
                "falling back to greedy argmax verification."
            )
    engine = Engine(
        target,
        algo,
        block_size=args.block_size,
        ddtree_budget=args.ddtree_budget,
        greedy_verify_only="greedy-fallback" in active,
        tree_verify_bug="tree-verify-bug" in active,
    )
    assert args.max_running_requests is not None and args.sampling_backend is not None
    try:
        scheduler = Scheduler(
            engine,
            max_running_requests=args.max_running_requests,
            decode_log_interval=args.decode_log_interval,
            sampling_backend=args.sampling_backend,
            context_length=args.effective_context_length,
            step_floor_s=gpu_step_seconds(args.gpu_step_ms, args.gpu_draft_ms, algo),
        )
    except Exception:
        logger.error("Scheduler hit an exception: %s", traceback.format_exc())
        faults.scheduler_died_at_startup()
        raise
    logger.info(
        "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, "
        "context_len=%d, available_gpu_mem=%.2f GB",
        args.max_running_requests * args.effective_context_length, args.chunked_prefill_size,
        args.max_prefill_tokens, args.max_running_requests, args.effective_context_length, _avail_mem_gb(),
    )  # fmt: skip
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    args.port = sock.getsockname()[1]  # --port 0: the port the kernel picked, logged by uvicorn
    state = ServerState(args, engine, scheduler)
    state.startup_seconds = {"load_weight": load_s, "scheduler_e2e": time.monotonic() - t0}
    uv_config = uvicorn.Config(
        build_app(state),
        host=args.host,
        port=args.port,
        log_config=uvicorn_log_config(args.log_level),
        timeout_keep_alive=5,
    )
    asyncio.run(_serve(_Server(uv_config), sock, state))


async def _serve(server: _Server, sock: socket.socket, state: ServerState) -> None:
    loop = asyncio.get_running_loop()
    state.loop = loop
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(state.graceful_exit()))
    state.scheduler.start()
    tasks: list[Awaitable[None]] = [server.serve(sockets=[sock]), _warmup(server, state)]
    if "crash-after" in state.faults:
        tasks.append(_crash_after(state.faults.value("crash-after")))
    await asyncio.gather(*tasks)


async def _warmup(server: _Server, state: ServerState) -> None:
    """SGLang's _wait_and_warmup: GET /model_info, then one greedy /generate over HTTP."""
    while not server.announced:
        await asyncio.sleep(0.01)
    if state.args.skip_server_warmup:
        state.ready = True
        return
    host = "127.0.0.1" if state.args.host in ("0.0.0.0", "::") else state.args.host
    base = f"http://{host}:{state.args.port}" if ":" not in host else f"http://[{host}]:{state.args.port}"
    headers = {"Content-Type": "application/json", WARMUP_HEADER: "1"}
    if state.args.api_key:
        headers["Authorization"] = f"Bearer {state.args.api_key}"
    body = dumps({"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}})

    def call() -> None:
        urllib.request.urlopen(urllib.request.Request(f"{base}/model_info", headers=headers), timeout=30).read()
        req = urllib.request.Request(f"{base}/generate", data=body.encode(), headers=headers, method="POST")
        urllib.request.urlopen(req, timeout=3600).read()

    try:
        await asyncio.to_thread(call)
    except Exception:
        logger.error("Initialization failed. warmup error: %s", traceback.format_exc())
        faults.kill_process_tree(include_parent=True)
    state.ready = True
    logger.info("The server is fired up and ready to roll!")


async def _crash_after(seconds: float) -> None:
    """The crash-after fault: an exception nobody catches ends the main process (exit status 1)."""
    await asyncio.sleep(seconds)
    raise RuntimeError(f"TokenizerManager event loop died: lost the scheduler after {seconds:g} s (crash-after)")


def _avail_mem_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _weights_gb(model: TinyLM) -> float:
    tensors = [model.embed, model.unembed, model.bigram, *(w for layer in model.layers for w in layer.values())]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**30


def gpu_step_seconds(step_ms: float, draft_ms: float | None, algorithm: str) -> float:
    """Floor of one scheduler iteration under the GPU cost model: a target pass, plus a draft pass if speculative."""
    if step_ms <= 0:
        return 0.0
    draft = step_ms / 8 if draft_ms is None else draft_ms
    return (step_ms + (draft if algorithm != "NONE" else 0.0)) / 1000
