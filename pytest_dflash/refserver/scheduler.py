"""The scheduler thread: admits requests, prefills them, then interleaves one decode (or draft +
verify) step per running request per iteration, so concurrent streams progress together.

It owns the faults that live "inside the scheduler" in real SGLang: a silent block while warming
up (slow-load, cold-jit), the FlashInfer sampling JIT on the first top-k/top-p/min-p request
(cold-jit blocks, flashinfer-sm120 raises), requests that never finish (hang), slow decoding. An
exception here is fatal, as in SGLang: "Scheduler hit an exception: Traceback ...", then the main
process kills itself (exit status 137).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_dflash.refserver import faults
from pytest_dflash.refserver.model import ByteTokenizer
from pytest_dflash.refserver.ranks import RankGroup
from pytest_dflash.refserver.spec import (
    Engine,
    SamplingParams,
    Sequence,
    SpecStats,
    finished_by_eos,
    log_softmax,
)

__all__ = ["Output", "Request", "Scheduler", "SpecTotals"]

logger = logging.getLogger("pytest_dflash.refserver")


@dataclass(frozen=True)
class Output:
    """What the scheduler hands back after a step: all ids so far, and the finish reason once done."""

    output_ids: list[int]
    new_count: int
    finish: dict[str, Any] | None
    logprobs: list[tuple[float, int, list[tuple[float, int]]]]  # every token so far (if asked for)
    stats: SpecStats
    prefill_finished: float
    first_token_time: float


@dataclass(eq=False)
class Request:
    """One sequence to generate. ``deliver`` is called on the scheduler thread."""

    rid: str
    prompt: list[int]
    params: SamplingParams
    seed: int
    deliver: Callable[[Output], None]
    log_metrics: bool = True
    hang: bool = False
    top_logprobs_num: int = -1  # -1: no logprobs
    stream: bool = True  # False: deliver only the final output (the HTTP side waits for it anyway)
    aborted: bool = False  # set by the HTTP side: client gone, health probe timed out
    seq: Sequence | None = None
    prefill_finished: float = 0.0
    first_token_time: float = 0.0
    logprobs: list[tuple[float, int, list[tuple[float, int]]]] = field(default_factory=list)


@dataclass
class SpecTotals:
    """Server-wide accept accounting since start or the last successful /flush_cache."""

    verify_ct: int = 0
    accepted_drafts: int = 0
    proposed_drafts: int = 0

    @property
    def avg_accept_length(self) -> float:
        return (self.accepted_drafts + self.verify_ct) / self.verify_ct if self.verify_ct else 0.0


@dataclass
class _Window:
    """Counters between two 'Decode batch' log lines."""

    started: float = field(default_factory=time.monotonic)
    steps: int = 0
    tokens: int = 0
    verify_ct: int = 0
    accepted: int = 0
    proposed: int = 0


class Scheduler(threading.Thread):
    """Runs the engine; everything else talks to it through ``submit`` and ``flush_cache``."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_running_requests: int,
        decode_log_interval: int,
        sampling_backend: str,
        context_length: int,
        die_on_error: bool = True,
        step_floor_s: float = 0.0,
        token_floor_s: float = 0.0,
        ranks: RankGroup | None = None,
    ) -> None:
        super().__init__(name="scheduler", daemon=True)
        self.ranks = ranks  # --tp-size > 1: every forward is stepped on every rank (a collective)
        self.die_on_error = die_on_error  # False in-process (tests): keep the error, do not kill the process
        self.error: BaseException | None = None
        self.engine = engine
        self.tokenizer = ByteTokenizer()
        self.max_running = max_running_requests
        self.decode_log_interval = decode_log_interval
        self.context_length = context_length
        self.inbox: queue.SimpleQueue[Request | Future[bool] | None] = queue.SimpleQueue()
        self._stopping = False
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.parked: list[Request] = []  # the hang fault: admitted, never stepped
        self.totals = SpecTotals()
        self.verify_calls_total = 0  # /metrics: never reset
        self._ddtree_verified = False
        self.last_gen_throughput = 0.0
        self.last_output = 0.0  # wall time of the last token out: what /health_generate watches
        self._window = _Window()
        self._last_prefill = time.monotonic()
        active = faults.active()
        self.warmup_until = time.monotonic() + max(
            active.values.get("slow-load", 0.0), active.values.get("cold-jit", 0.0)
        )
        self.slow_factor = active.values.get("slow-decode", 1.0)
        self.token_delay_s = active.values.get("token-delay", 0.0)  # a step costs this per token it commits
        self.wedged = False  # the wedge fault: the loop stops stepping for good (HTTP stays up)
        self.paused = False  # POST /pause_generation (in_place / retract) until POST /continue_generation
        self._step_tokens = 0  # the most tokens one sequence committed in the last step
        # GPU cost model (--gpu-step-ms): on a GPU one pass costs about the same for 1 or 64 tokens and
        # for 1 or many sequences (memory-bound), which is what makes speculative decoding pay off.
        self.step_floor_s = step_floor_s
        # --gpu-token-us: each running sequence adds the cost of the tokens its pass verifies, so a big batch
        # of speculative sequences stops being free (cost_model.py)
        self.token_floor_s = token_floor_s
        self.sampling_kernel = _sampling_kernel(sampling_backend)
        self.init_memory_pool()

    # --- start-up ---------------------------------------------------------------------------------

    def init_memory_pool(self) -> None:
        """Log the KV pool as SGLang does; the scheduler-crash fault fails here."""
        tokens = self.max_running * self.context_length
        cfg = self.engine.target.config
        size_gb = tokens * cfg.n_layers * cfg.d_model * 8 / 2**30
        if "scheduler-crash" in faults.active():
            time.sleep(faults.active().value("scheduler-crash"))
            self._create_buffers(size_gb)
        logger.info(
            "KV Cache is allocated. dtype: torch.float64, #tokens: %d, K size: %.2f GB, V size: %.2f GB",
            tokens, size_gb, size_gb,
        )  # fmt: skip

    @staticmethod
    def _create_buffers(size_gb: float) -> None:
        import torch

        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {size_gb * 1024:.2f} MiB. GPU 0 has a total capacity of "
            "139.80 GiB of which 658.75 MiB is free. Including non-PyTorch memory, this process has 5.35 GiB "
            "memory in use. Of the allocated memory 4.66 GiB is allocated by PyTorch, and 23.35 MiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        )

    # --- API for the HTTP side (any thread) -------------------------------------------------------

    def submit(self, req: Request) -> None:
        self.inbox.put(req)

    def shutdown(self) -> None:
        """Stop the loop after the current iteration (in-process use; the server never stops it)."""
        self._stopping = True
        self.inbox.put(None)

    def flush_cache(self) -> Future[bool]:
        """Reset the accept-length counters; refused while requests run or wait (as SGLang)."""
        fut: Future[bool] = Future()
        self.inbox.put(fut)
        return fut

    def load(self) -> dict[str, Any]:
        running = list(self.running) + list(self.parked)
        return {
            "num_reqs": len(running) + len(self.waiting),
            "num_waiting_reqs": len(self.waiting),
            "num_tokens": sum(len(r.prompt) + len(r.seq.output) for r in running if r.seq is not None),
        }

    def busy_rids(self) -> list[str]:
        return [r.rid for r in (*self.running, *self.parked, *self.waiting)
                if r.log_metrics and not r.aborted]

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self.event_loop()
        except Exception as e:
            logger.error("Scheduler hit an exception: %s", traceback.format_exc())
            self.error = e
            if self.die_on_error:
                faults.scheduler_died_at_runtime(faults.active().values.get("flashinfer-sm120", 3.0))

    def event_loop(self) -> None:
        # Warm-up (slow-load, cold-jit): the scheduler is busy and silent; requests queue up.
        time.sleep(max(0.0, self.warmup_until - time.monotonic()))
        while not self._stopping:
            if self.wedged:
                self._wedge()
                continue
            if self.paused:  # requests stay where they are, new ones queue; nothing is stepped
                self._drain_inbox(block=True)
                continue
            self._drain_inbox(block=not self.running and not self.waiting)
            if self.paused:  # paused while the loop waited for work
                continue
            started = time.monotonic()
            self._admit()
            if self.running:
                if self.ranks is not None:
                    self.ranks.step()
                # the iteration's floor is charged once over the whole running batch, as one GPU pass
                floor = self.step_floor_s + self.token_floor_s * len(self.running)
                self.run_batch()
                spent = time.monotonic() - started
                step = max(spent, floor) * self.slow_factor
                if step > spent:
                    time.sleep(step - spent)

    def wedge(self) -> None:
        """The wedge fault: from the next iteration on, the scheduler never steps again (a deadlocked
        collective or a GPU that stopped answering): requests already running and every new one wait forever,
        no output leaves, /health_generate times out (503), /metrics counters stop moving; the HTTP process
        still answers."""
        self.wedged = True  # silent, as a real wedge is (SGLang's watchdog would speak only after 300 s)

    def pause(self) -> None:
        """SGLang's in-place (or retract) pause: no inference until resume(); the requests keep their state
        (a retracted one is recomputed on resume in SGLang: the same tokens come out). gen_throughput is
        zeroed at once, as SGLang's pause_generation does for dashboards."""
        self.paused = True
        self.last_gen_throughput = 0.0

    def resume(self) -> None:
        self.paused = False
        self.inbox.put(None)  # wake the loop

    def _wedge(self) -> None:
        while not self._stopping:  # in-process use only ends it (shutdown); the server never does
            self._drain_inbox(block=True)  # new requests queue up (/metrics num_queue_reqs), never run

    def _drain_inbox(self, *, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if item is None:
                pass
            elif isinstance(item, Future):
                self._flush(item)
            elif item.hang:
                self.parked.append(item)
            else:
                self.waiting.append(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _flush(self, fut: Future[bool]) -> None:
        busy = [r for r in (*self.running, *self.parked, *self.waiting) if not r.aborted]
        if busy:
            logger.warning(
                "Cache not flushed because there are pending requests. #queue-req: %d, #running-req: %d",
                len(self.waiting), len(self.running) + len(self.parked),
            )  # fmt: skip
            fut.set_result(False)
            return
        self.totals = SpecTotals()
        logger.info("Cache flushed successfully!")
        fut.set_result(True)

    def _admit(self) -> None:
        """Prefill waiting requests up to max_running_requests, as one logged prefill batch."""
        new: list[Request] = []
        while self.waiting and len(self.running) + len(new) < self.max_running:
            req = self.waiting.popleft()
            if not req.aborted:
                new.append(req)
        if not new:
            return
        running_before = len(self.running)
        if self.token_delay_s:
            # token-delay: the prefill batch costs a token's time before its tokens
            time.sleep(self.token_delay_s)
        for req in new:
            self._maybe_sampling_kernel(req.params)
            req.seq, first = self.engine.start(req.prompt, req.params, req.seed)
            req.prefill_finished = time.time()
            self._emit(req, first.tokens if req.params.max_new_tokens > 0 else [], first.rows)
        now = time.monotonic()
        n_tokens = sum(len(r.prompt) for r in new)
        logger.info(
            "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: 0, token usage: 0.00, #running-req: "
            "%d, #queue-req: %d, #pending-token: 0, cuda graph: False, input throughput (token/s): %.2f",
            len(new), n_tokens, running_before, len(self.waiting),
            n_tokens / max(now - self._last_prefill, 1e-6),
        )  # fmt: skip
        self._last_prefill = now

    def run_batch(self) -> None:
        """One step for every running request."""
        commit_lens = []
        self._step_tokens = 0
        # token-delay: emitted after the delay
        delayed: list[tuple[Request, list[int], list[np.ndarray]]] = []
        for req in list(self.running):
            if req.aborted:
                self.running.remove(req)
                continue
            assert req.seq is not None
            before = req.seq.stats.verify_ct, req.seq.stats.accepted_drafts, req.seq.stats.proposed_drafts
            self._maybe_sampling_kernel(req.params)
            step = self.engine.step(req.seq)
            if req.seq.stats.verify_ct > before[0]:
                commit_lens.append(len(step.tokens))
            self._account(req.seq.stats, before)
            self._step_tokens = max(self._step_tokens, len(step.tokens))
            if self.token_delay_s:
                delayed.append((req, step.tokens, step.rows))
            else:
                self._emit(req, step.tokens, step.rows)
        if delayed:  # the step costs its time before its tokens leave, as on a GPU
            time.sleep(self.token_delay_s * self._step_tokens)
            for req, tokens, rows in delayed:
                self._emit(req, tokens, rows)
        if self.engine.algorithm == "DDTREE" and not self._ddtree_verified and commit_lens:
            # the ddtree-v2 port logs its first verify step once, one length per request of the batch (H200:
            # [1] on a random draft, [16] = the whole block on the lossy tree, [5, 5] for two requests at
            # once)
            self._ddtree_verified = True
            logger.info("DDTREE v2 verify completed. first commit_lens=[%s]",
                        ", ".join(map(str, commit_lens)))
        self._window.steps += 1
        if self._window.steps >= self.decode_log_interval:
            self._log_decode()

    def _account(self, stats: SpecStats, before: tuple[int, int, int]) -> None:
        w = self._window
        d_verify = stats.verify_ct - before[0]
        w.verify_ct += d_verify
        w.accepted += stats.accepted_drafts - before[1]
        w.proposed += stats.proposed_drafts - before[2]
        self.verify_calls_total += d_verify
        self.totals.verify_ct += d_verify
        self.totals.accepted_drafts += stats.accepted_drafts - before[1]
        self.totals.proposed_drafts += stats.proposed_drafts - before[2]

    def _emit(self, req: Request, tokens: list[int], rows: list[np.ndarray]) -> None:
        """Append tokens one by one until a stop condition; deliver them; retire finished requests."""
        assert req.seq is not None
        seq, params = req.seq, req.params
        finish: dict[str, Any] | None = None
        kept = 0
        if params.max_new_tokens == 0:
            finish = {"type": "length", "length": 0}
        for tok in tokens:
            seq.output.append(tok)
            kept += 1
            if (finish := self._check_finished(seq)) is not None:
                break
        self._window.tokens += kept
        self.last_output = now = time.time()
        if kept and not req.first_token_time:
            req.first_token_time = now
        if req.top_logprobs_num >= 0:
            for tok, row in zip(seq.output[len(seq.output) - kept :], rows, strict=False):
                lp = log_softmax(row if params.is_greedy else row / params.temperature)
                top = np.argsort(-lp, kind="stable")[: req.top_logprobs_num]
                req.logprobs.append((float(lp[tok]), tok, [(float(lp[t]), int(t)) for t in top]))
        if req.stream or finish is not None:
            out = Output(list(seq.output), kept, finish, list(req.logprobs), _copy(seq.stats),
                         req.prefill_finished, req.first_token_time)  # fmt: skip
            req.deliver(out)
        if finish is not None:
            if req in self.running:
                self.running.remove(req)
        elif req not in self.running:
            self.running.append(req)

    def _check_finished(self, seq: Sequence) -> dict[str, Any] | None:
        """SGLang's order: length, then stop token / EOS, then stop strings."""
        params, tok = seq.params, seq.output[-1]
        if params.abort_after_first is not None:
            return {"type": "abort", "message": params.abort_after_first, "status_code": 400,
                    "err_type": "BadRequestError"}
        if seq.constraint is not None and (refused := seq.constraint.refusal(len(seq.output))) is not None:
            return refused  # SGLang: "Grammar accept_token failed", the request aborted
        if len(seq.output) >= params.max_new_tokens:
            return {"type": "length", "length": params.max_new_tokens}
        # SGLang checks stop_token_ids together with EOS, so ignore_eos disables both (stop strings still
        # apply).
        if not params.ignore_eos and (tok in params.stop_token_ids or finished_by_eos(tok, params)):
            return {"type": "stop", "matched": tok}
        if params.stop:
            width = 4 * max(len(s) for s in params.stop) + 4
            tail = self.tokenizer.decode(seq.output[-width:])
            for stop in params.stop:
                if stop and stop in tail:
                    return {"type": "stop", "matched": stop}
        if len(seq.prompt) + len(seq.output) >= self.context_length:
            return {"type": "length", "length": len(seq.output)}
        return None

    def _maybe_sampling_kernel(self, params: SamplingParams) -> None:
        if self.sampling_kernel is not None and params.needs_sampling_kernel:
            self.sampling_kernel(params)

    def _log_decode(self) -> None:
        w, now = self._window, time.monotonic()
        self.last_gen_throughput = w.tokens / max(now - w.started, 1e-6)
        spec = ""
        if self.engine.algorithm != "NONE":
            accept_len = (w.accepted + w.verify_ct) / w.verify_ct if w.verify_ct else 1.0
            spec = f"accept len: {accept_len:.2f}, accept rate: {w.accepted / max(w.proposed, 1):.2f}, "
        n_tokens = sum(len(r.prompt) + len(r.seq.output) for r in self.running if r.seq is not None)
        logger.info(
            "Decode batch, #running-req: %d, #token: %d, token usage: 0.00, %scuda graph: False, "
            "gen throughput (token/s): %.2f, #queue-req: %d",
            len(self.running), n_tokens, spec, self.last_gen_throughput, len(self.waiting),
        )  # fmt: skip
        self._window = _Window()


def _copy(stats: SpecStats) -> SpecStats:
    return SpecStats(stats.verify_ct, stats.accepted_drafts, stats.proposed_drafts, list(stats.histogram))


def _sampling_kernel(sampling_backend: str) -> Callable[[SamplingParams], None] | None:
    """FlashInfer's top-k/top-p sampling entry, JIT-built on first use: only under its faults.

    cold-jit: the first call blocks (the build) with nothing in the log. flashinfer-sm120: the build
    fails its architecture check (SM 12.0 with CUDA 12.8) and raises inside the scheduler.
    """
    active = faults.active()
    if sampling_backend != "flashinfer" or not ("cold-jit" in active or "flashinfer-sm120" in active):
        return None
    from pytest_dflash.refserver.fault_site.flashinfer import compilation_context
    from pytest_dflash.refserver.fault_site.flashinfer.jit import core

    if "flashinfer-sm120" in active:
        compilation_context.DEVICE_CAPABILITY = (12, 0)
        compilation_context.NVCC_VERSION = (12, 8)
    core.BUILD_SECONDS = active.values.get("cold-jit", 0.0)

    def sample(params: SamplingParams) -> None:
        from pytest_dflash.refserver.fault_site.flashinfer.sampling import top_k_top_p_sampling_from_probs

        probs = np.full(8, 1 / 8)
        top_k_top_p_sampling_from_probs(probs, params.top_k, params.top_p)

    return sample
