"""What the routes share: the server state, the sequences of each HTTP request, the JSON encoding.

Both route modules (routes.py, openai_api.py) and the start-up (server.py) import this one, so
none of them imports another's internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import Request

from pytest_dflash.refserver import faults
from pytest_dflash.refserver.metrics import Metrics
from pytest_dflash.refserver.model import ByteTokenizer
from pytest_dflash.refserver.scheduler import Output, Scheduler
from pytest_dflash.refserver.scheduler import Request as GenRequest
from pytest_dflash.refserver.server_args import ServerArgs
from pytest_dflash.refserver.spec import Engine, SamplingParams

__all__ = ["WARMUP_HEADER", "Batch", "Gen", "ServerState", "corrupt", "dumps"]

logger = logging.getLogger("pytest_dflash.refserver")

WARMUP_HEADER = "x-refserver-warmup"  # keeps the warm-up request out of the hang/oom-kill counts


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
        self.unhealthy = False  # a health check failed (SGLang: ServerStatus.UnHealthy) until one succeeds
        self.created = int(time.time())
        self.startup_seconds: dict[str, float] = {}
        self.generation_requests = 0  # the hang fault counts these
        self.completed_generations = 0  # the oom-kill fault counts these
        self.being_killed = False  # the oom-kill fault fired: later requests wait for the SIGKILL, unanswered
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
        if self.scheduler.ranks is not None:
            self.scheduler.ranks.request_arrived()
        if "wedge" in self.faults and self.generation_requests > int(self.faults.value("wedge")):
            self.scheduler.wedge()
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
        text = (self.tokenizer.decode(ids, skip_special_tokens=skip) if final
                else self.tokenizer.decode_complete(ids))
        if final and isinstance(matched, str) and (pos := text.find(matched)) != -1:
            text = text[:pos]
        return text

    def meta_info(self, gen: Gen, out: Output, *, final: bool, logprobs: bool,
                  stream: bool = False) -> dict[str, Any]:
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
                spec_accept_rate=(stats.accepted_drafts / stats.proposed_drafts if stats.proposed_drafts
                                  else 0.0),
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
        return self.args.mimic.meta_info(meta)

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


def corrupt(payload: str) -> str:
    """The bad-json fault: the body is cut short, so it no longer parses."""
    return payload[: max(1, len(payload) * 2 // 3)]


def dumps(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
