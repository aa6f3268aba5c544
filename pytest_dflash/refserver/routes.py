"""SGLang 0.5.17's native routes (/health_generate, /server_info, /generate, ...) and the app they live on.

build_app adds the OpenAI routes from openai_api.py; both take what they share from state.py and
params.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pytest_dflash.refserver import faults, mimic, openai_api
from pytest_dflash.refserver.cost_model import weights_gb
from pytest_dflash.refserver.params import LOGPROB_REFUSED, BadRequest, check_grammar, parse_sampling_params
from pytest_dflash.refserver.spec import SamplingParams
from pytest_dflash.refserver.state import WARMUP_HEADER, Batch, ServerState, corrupt, dumps

__all__ = ["SGLANG_VERSION", "build_app", "error_json"]

logger = logging.getLogger("pytest_dflash.refserver")

SGLANG_VERSION = "0.5.17"
GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
    "requests, the operation will not be performed.)\n"
)


def error_json(message: str, status: int = 400) -> JSONResponse:
    """SGLang's native error body."""
    logger.error("[http_server] Error: %s", message)
    return JSONResponse({"error": {"message": message}}, status_code=status)


def build_app(state: ServerState) -> FastAPI:
    """All routes; OpenAI ones are added by openai_api.add_routes."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.state.refserver = state
    args = state.args

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.middleware("http")
    async def outer(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        # SGLang's auth (utils/auth.py) always lets health, readiness (0.5.20+) and metrics through
        open_path = request.method == "OPTIONS" or path.startswith(
            ("/health", "/metrics", "/ready") if args.mimic.has_route("/ready") else ("/health", "/metrics"))
        authorized = request.headers.get("authorization") == f"Bearer {args.api_key}"
        if args.api_key is not None and not open_path and not authorized:
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if state.being_killed:  # the process dies in a moment: nothing more gets an answer
            await asyncio.sleep(3600)
        key = (path, request.method)
        state.metrics.http_requests[key] = state.metrics.http_requests.get(key, 0) + 1
        response = await call_next(request)
        rkey = (path, request.method, response.status_code)
        state.metrics.http_responses[rkey] = state.metrics.http_responses.get(rkey, 0) + 1
        if (path in GENERATION_PATHS and response.status_code == 200
                and not request.headers.get(WARMUP_HEADER)):
            state.completed_generations += 1
            if "oom-kill" in state.faults and state.completed_generations >= state.faults.value("oom-kill"):
                state.being_killed = True
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
        if args.mimic.health_bypassed(os.environ):  # 0.5.19+: "Let an external E2E driver establish ..."
            return Response(status_code=200)
        params = SamplingParams(max_new_tokens=1, temperature=1.0, top_k=1)
        batch = state.new_batch([[0]], [params], log_metrics=False)
        tic = time.time()
        try:
            while time.time() < tic + state.health_timeout:
                await asyncio.sleep(0.02)
                if state.last_receive > tic:
                    state.unhealthy = False  # SGLang: server_status = ServerStatus.Up
                    return Response(status_code=200)
        finally:
            batch.abort()
        state.unhealthy = True  # SGLang: server_status = ServerStatus.UnHealthy (GET /ready 503 until a 200)
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
        return JSONResponse(args.mimic.model_info(
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
            }, args.served_model_name or args.model_path)
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
                "weight": weights_gb(state.engine.target),
                "kvcache": 0.0,
                "token_capacity": state.scheduler.max_running * state.context_length,
            },
            "startup_time": state.startup_seconds,
            "effective_max_running_requests_per_dp": state.scheduler.max_running,
        }
        if state.spec:
            internal["avg_spec_accept_length"] = state.scheduler.totals.avg_accept_length
        return JSONResponse(args.mimic.server_info(
            {
                **server_args,
                "status": "ready" if state.ready else "starting",
                "max_total_num_tokens": state.scheduler.max_running * state.context_length,
                "max_req_input_len": state.context_length - 1,
                "startup_time": state.startup_seconds,
                "internal_states": [internal],
                "version": SGLANG_VERSION,
                "kv_events": None,
            }, mimic.split_argv(sys.argv[1:])[1])  # the command line less --mimic-version
        )

    def healthy() -> bool:  # SGLang 0.5.23 TokenizerManager.is_healthy
        return state.ready and not state.gracefully_exit and not state.unhealthy

    async def ready() -> Response:  # SGLang's is_ready: healthy and not paused
        return Response(status_code=200 if healthy() and not state.scheduler.paused else 503)

    if args.mimic.has_route("/ready"):  # 0.5.20 added it
        app.get("/ready")(ready)

    @app.get("/ping")
    async def ping() -> Response:
        """SageMaker's health check: the HTTP server answers (0.5.23: and is healthy, paused or not)."""
        return Response(status_code=200 if healthy() or not args.mimic.ping_tells_health() else 503)

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        """SGLang's pause, modes in_place and retract: generation stops until /continue_generation; requests
        in flight wait. Mode abort (SGLang's default: every request aborted) is not mimicked: 400."""
        body = await request.json() if await request.body() else {}
        mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode not in ("in_place", "retract"):
            return error_json(f"refserver: pause_generation mode {mode!r} is not mimicked (use in_place or "
                              "retract)")
        state.scheduler.pause()
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> Response:
        state.scheduler.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def get_load() -> Response:
        logger.info("Endpoint '/get_load' is deprecated and will be removed in a future version. "
                    "Please use '/v1/loads' instead.")  # fmt: skip
        load = state.scheduler.load()
        return JSONResponse([{"dp_rank": 0, **load, "num_pending_tokens": 0, "ts_tic": time.monotonic()}])

    if args.mimic.has_route("/get_load"):  # 0.5.21 removed it
        app.get("/get_load")(get_load)

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
                    msg = LOGPROB_REFUSED
                    logger.info("%s, self.rid=%r", msg, uuid.uuid4().hex)
                    raise BadRequest(msg)
                top_n = int(body.get("top_logprobs_num") or 0)
        except BadRequest as e:
            return error_json(str(e))
        except (ValueError, TypeError) as e:
            return error_json(f"Invalid request: {e}")
        batch = state.new_batch(prompts, params, hang=hang, top_logprobs_num=top_n,
                                stream=bool(body.get("stream")))
        if body.get("stream"):
            batch.streaming = True
            return StreamingResponse(_generate_stream(state, batch, single, top_n >= 0),
                                     media_type="text/event-stream")
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


def _generate_inputs(state: ServerState,
                     body: dict[str, Any]) -> tuple[list[list[int]], list[SamplingParams], bool]:
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
        params = check_grammar(params, state.engine.grammar, stream=bool(body.get("stream")))
        for i in range(params.n):
            seed = state.seed_for(params.sampling_seed, i)
            out_prompts.append(prompt)
            out_params.append(SamplingParams(**{**params.__dict__, "sampling_seed": seed, "n": 1}))
    return out_prompts, out_params, single and len(out_prompts) == 1


async def _generate_stream(state: ServerState, batch: Batch, single: bool,
                           logprobs: bool) -> AsyncIterator[str]:
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
