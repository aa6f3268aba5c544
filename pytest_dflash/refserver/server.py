"""Start-up: SGLang 0.5.17's launch sequence, then uvicorn in front of the scheduler thread.

Start-up follows SGLang: log the server args, load the model, allocate the KV pools, capture the CUDA graphs
(services/phases.py reads these lines), bind, serve,
then a warm-up request through HTTP; /health_generate answers 503 until it has finished. The routes
live in routes.py (native) and openai_api.py (OpenAI), what they share in state.py.
"""

from __future__ import annotations

# SGLang's HTTP server imports its transcription routes first (and with them soundfile).
from pytest_dflash.refserver import transcription  # noqa: F401  # isort: skip

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import traceback
import urllib.request
from collections.abc import Awaitable, Generator

import torch
import uvicorn

from pytest_dflash.refserver import faults
from pytest_dflash.refserver.chat_surface import think_end_ids
from pytest_dflash.refserver.cost_model import avail_mem_gb, gpu_step_seconds, gpu_token_seconds, weights_gb
from pytest_dflash.refserver.logs import setup_logging, uvicorn_log_config
from pytest_dflash.refserver.model import ModelConfig, TinyLM
from pytest_dflash.refserver.ranks import RankFaults, RankGroup
from pytest_dflash.refserver.routes import build_app
from pytest_dflash.refserver.scheduler import Scheduler
from pytest_dflash.refserver.server_args import ServerArgs
from pytest_dflash.refserver.spec import Engine
from pytest_dflash.refserver.state import WARMUP_HEADER, ServerState, dumps
from pytest_dflash.refserver.structured import GrammarBackend

__all__ = ["launch_server", "listening_socket"]

logger = logging.getLogger("pytest_dflash.refserver")


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
    if (args.speculative_algorithm or "NONE") == "DDTREE" and args.grammar_backend != "none":
        # as the ddtree-v2 port does (recorded on the H200), before the server_args line
        logger.info("DDTREE does not support grammar-constrained decoding; setting --grammar-backend none "
                    "(was %r) so such requests are rejected instead of crashing the scheduler.",
                    args.grammar_backend)
        args.grammar_backend = "none"
    for line in args.adjustments:
        logger.warning(line)
    logger.info(args.log_line())
    t0 = time.monotonic()
    ranks = _start_ranks(args)
    config = ModelConfig(context_length=args.effective_context_length)
    logger.info("Load weight begin. avail mem=%.2f GB", avail_mem_gb())
    target = TinyLM(config, args.model_seed)
    load_s = time.monotonic() - t0
    logger.info(
        "Load weight end. elapsed=%.2f s, type=RefTinyForCausalLM, avail mem=%.2f GB, mem usage=%.2f GB.",
        load_s, avail_mem_gb(), weights_gb(target),
    )  # fmt: skip
    algo = args.speculative_algorithm or "NONE"
    active = faults.active()
    if algo in ("DFLASH", "DDTREE"):
        # DDTREE drafts with the DFLASH draft runner too (real SGLang logs this line for both), then logs
        # its worker
        logger.info(
            "Initialized DFLASH draft runner. attention_backend=%s, model=EarlyExitDraftModel, "
            "block_size=%d, draft_window_size=None, compact_cache=False",
            args.attention_backend, args.block_size,
        )  # fmt: skip
        if algo == "DDTREE":
            budget = args.ddtree_budget
            logger.info(
                "Initialized DDTREE v2 worker. block_size=%d, tree_budget=%d, max_tree_nodes=%d, "
                "prune=False, tree_attention=False, cpu_build=False, cpu_follow=False, graph_buckets=[%d]",
                args.block_size, budget, budget + 1, budget + 1,
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
        num_steps=args.speculative_num_steps or 1,
        topk=args.speculative_eagle_topk or 1,
        random_draft=args.random_draft,
        grammar=None if args.grammar_backend == "none" else GrammarBackend(
            any_whitespace=not args.constrained_json_disable_any_whitespace,
            # SGLang wraps the backend in its ReasonerGrammarBackend when a reasoning parser is set; the
            # reasoning-grammar-bug fault leaves the wrapper out (the grammar holds from the first token)
            think_end_ids=() if "reasoning-grammar-bug" in active else think_end_ids(args.reasoning_parser),
        ),
        grammar_rollback_bug="grammar-rollback-bug" in active,
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
            token_floor_s=gpu_token_seconds(args.gpu_token_us, algo, args.block_size, args.ddtree_budget),
            ranks=ranks,
        )
    except Exception:
        logger.error("Scheduler hit an exception: %s", traceback.format_exc())
        faults.scheduler_died_at_startup()
        raise
    kv_s = _allocate_kv_pools(args, algo)
    graphs_s = _capture_cuda_graphs(args, active.values.get("slow-graphs", 0.0))
    logger.info(
        "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, "
        "context_len=%d, available_gpu_mem=%.2f GB",
        args.max_running_requests * args.effective_context_length, args.chunked_prefill_size,
        args.max_prefill_tokens, args.max_running_requests, args.effective_context_length, avail_mem_gb(),
    )  # fmt: skip
    logger.info(
        "Engine startup timings (s): load_weight=%.2f, kv_cache_allocation=%.2f, scheduler_e2e=%.2f, "
        "cuda_graph={prefill=%.2f, decode=0.00, target_verify=0.00, draft_prefill=0.00, draft_decode=0.00, "
        "draft_extend=0.00}",
        load_s, kv_s, time.monotonic() - t0, graphs_s,
    )  # fmt: skip
    sock = listening_socket(args.host, args.port)
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


def _start_ranks(args: ServerArgs) -> RankGroup | None:
    """--tp-size N > 1: N scheduler-rank processes, joined before the weights load (SGLang launches its
    schedulers first and waits for each to report ready); None on one GPU."""
    if args.tp_size < 2:
        return None
    ranks = RankGroup(args.tp_size, RankFaults.from_active(faults.active()), log_level=args.log_level,
                      watchdog_timeout_s=args.watchdog_timeout,
                      on_death=lambda: faults.scheduler_died_at_runtime(1.0))
    ranks.start()
    ranks.wait_joined()
    return ranks


def _allocate_kv_pools(args: ServerArgs, algo: str) -> float:
    """SGLang 0.5.17's KV-pool lines, at the same moment (after the weights, before the CUDA graphs and the
    port): the target's pool (its 'KV Cache is allocated' line comes from the scheduler, where scheduler-crash
    fails), then the draft's for DFLASH/DDTREE, each closed by 'Memory pool end'. Returns the seconds it
    took."""
    started = time.monotonic()
    logger.info("Memory pool end. avail mem=%.2f GB", avail_mem_gb())
    if algo in ("DFLASH", "DDTREE"):
        assert args.max_running_requests is not None
        tokens = args.max_running_requests * args.effective_context_length
        size = tokens * 2 / 2**30  # bf16, one value per token: the refserver's draft keeps no real pool
        logger.info("KV Cache is allocated. dtype: torch.bfloat16, #tokens: %d, K size: %.2f GB, "
                    "V size: %.2f GB", tokens, size, size)
        logger.info("Memory pool end. avail mem=%.2f GB", avail_mem_gb())
    return time.monotonic() - started


def _capture_cuda_graphs(args: ServerArgs, seconds: float) -> float:
    """SGLang 0.5.17's CUDA-graph capture lines, after the KV pools and before the port opens (the slow-graphs
    fault makes the capture take `seconds`, as up to 185 s did on the H200); with --disable-cuda-graph its
    'Disable prefill CUDA graph' line instead. Returns the seconds it took."""
    if args.disable_cuda_graph:
        logger.info("Disable prefill CUDA graph because cuda_graph_config resolved "
                    "prefill.backend='disabled' (e.g. via --cuda-graph-backend-prefill=disabled or "
                    "auto-disable rules).")
        return 0.0
    started = time.monotonic()
    logger.info("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 12, 16], "
                "avail mem=%.2f GB", avail_mem_gb())
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    logger.info("Capture target prefill CUDA graph end. elapsed=%.2f s, mem usage=0.00 GB, "
                "avail mem=%.2f GB.", elapsed, avail_mem_gb())
    return elapsed


def listening_socket(host: str, port: int) -> socket.socket:
    """The bound socket uvicorn serves on.

    proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets that say they are TCP, and
    without it uvicorn's separate head and body writes meet the client's delayed ACK (40 ms per JSON answer).
    uvicorn's own bind (SGLang's) goes through getaddrinfo and gets the same.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


async def _serve(server: _Server, sock: socket.socket, state: ServerState) -> None:
    loop = asyncio.get_running_loop()
    state.loop = loop
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(state.graceful_exit()))
    state.scheduler.start()
    tasks: list[Awaitable[None]] = [server.serve(sockets=[sock]), _warmup(server, state)]
    if "crash-after" in state.faults:
        tasks.append(_crash_after(state.faults.value("crash-after")))
    if "scheduler-segv" in state.faults:
        tasks.append(_scheduler_segv_after(state.faults.value("scheduler-segv"), state))
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
    body = dumps({"text": "The capital city of France is",
                  "sampling_params": {"temperature": 0, "max_new_tokens": 8}})

    def call() -> None:
        urllib.request.urlopen(urllib.request.Request(f"{base}/model_info", headers=headers),
                               timeout=30).read()
        req = urllib.request.Request(f"{base}/generate", data=body.encode(), headers=headers, method="POST")
        urllib.request.urlopen(req, timeout=3600).read()

    try:
        await asyncio.to_thread(call)
    except Exception:
        logger.error("Initialization failed. warmup error: %s", traceback.format_exc())
        faults.kill_process_tree(include_parent=True)
    state.ready = True
    logger.info("The server is fired up and ready to roll!")


async def _scheduler_segv_after(seconds: float, state: ServerState) -> None:
    """The scheduler-segv fault: the scheduler dies of SIGSEGV `seconds` after the server is ready (after its
    warm-up, so a slow start cannot move the death into readiness); the server kills itself."""
    while not state.ready:
        await asyncio.sleep(0.05)
    await asyncio.sleep(seconds)
    # The refserver's scheduler is a thread: the pid SGLang would name is its child's; this one is its
    # own + 1.
    faults.scheduler_segfaulted(os.getpid() + 1, 0.2)


async def _crash_after(seconds: float) -> None:
    """The crash-after fault: an exception nobody catches ends the main process (exit status 1)."""
    await asyncio.sleep(seconds)
    raise RuntimeError(f"TokenizerManager event loop died: lost the scheduler after {seconds:g} s "
                       f"(crash-after)")
