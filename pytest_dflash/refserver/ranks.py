"""Tensor-parallel ranks: with ``--tp-size N`` (N > 1) the refserver runs N real scheduler-rank processes.

As in SGLang 0.5.17, each rank is a process titled ``sglang::scheduler_TP{i}`` (setproctitle, as SGLang's
``run_scheduler_process``) whose log lines carry `` TP{i}`` in their time stamp (``[2026-12-04 21:29:48 TP1]
Init torch distributed begin.``) and which takes visible GPU ``i`` (``--base-gpu-id`` 0, step 1). Every rank
must step for a token to come out: the scheduler thread hands each forward to all ranks and waits for every
one, as a collective would. So a rank that stops (SIGSTOP, ``rank-hang``) wedges the engine; a rank that dies
makes the subprocess watchdog end the server, naming ``scheduler_{i}`` and its pid; a rank that fails at
start-up ends the launch the way a child's SIGQUIT does; ``nccl-init-hang`` keeps every rank in NCCL init.

This module is both sides: :class:`RankGroup` in the server, :func:`main` in each rank
(``python -m pytest_dflash.refserver.ranks``). Ranks import nothing heavy (no torch): a rank costs a few MB.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_dflash.refserver import faults
from pytest_dflash.refserver.logs import DATEFMT

__all__ = ["RankFaults", "RankGroup", "main"]

logger = logging.getLogger("pytest_dflash.refserver")

_PR_SET_PDEATHSIG = 1
READY = b"ready\n"
ACK = b"k\n"


@dataclass(frozen=True)
class RankFaults:
    """The rank faults of one launch: which rank, and after how many user requests (None: at start-up)."""

    crash: tuple[int, int | None] | None = None
    hang: tuple[int, int] | None = None
    oom: int | None = None
    nccl_init_hang: bool = False

    @classmethod
    def from_active(cls, active: faults.Faults) -> RankFaults:
        crash = hang = None
        if "rank-crash" in active:
            after = active.values.get("rank-crash@")
            crash = (int(active.value("rank-crash")), None if after is None else int(after))
        if "rank-hang" in active:
            hang = (int(active.value("rank-hang")), int(active.values.get("rank-hang@", 1)))
        oom = int(active.value("rank-oom")) if "rank-oom" in active else None
        return cls(crash, hang, oom, "nccl-init-hang" in active)

    def argv(self) -> list[str]:
        out: list[str] = []
        if self.crash is not None:
            out += ["--crash", f"{self.crash[0]}@{'' if self.crash[1] is None else self.crash[1]}"]
        if self.hang is not None:
            out += ["--hang", f"{self.hang[0]}@{self.hang[1]}"]
        if self.oom is not None:
            out += ["--oom", str(self.oom)]
        return [*out, *(["--nccl-init-hang"] if self.nccl_init_hang else [])]


class RankDied(RuntimeError):
    """A rank process ended while the server needed it."""

    def __init__(self, rank: int, pid: int, code: int | None) -> None:
        super().__init__(f"scheduler_{rank} (pid={pid}) exited with code {code}")
        self.rank, self.pid, self.code = rank, pid, code


class RankGroup:
    """The server side: start the ranks, wait for them to join, step them, and watch them die."""

    def __init__(self, tp_size: int, rank_faults: RankFaults, *, log_level: str, watchdog_timeout_s: float,
                 on_death: Callable[[], None]) -> None:
        self.tp_size = tp_size
        self.rank_faults = rank_faults
        self.log_level = log_level
        self.watchdog_timeout_s = watchdog_timeout_s
        self.on_death = on_death  # what the server does after a rank died while serving (it never returns)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.requests = 0  # user requests so far: the rank faults' @K counts these
        self._lock = threading.Lock()
        self._stepping = False

    def start(self) -> None:
        """Spawn every rank (from the main thread: PR_SET_PDEATHSIG follows the spawning thread)."""
        for rank in range(self.tp_size):
            argv = [sys.executable, "-m", "pytest_dflash.refserver.ranks", "--rank", str(rank),
                    "--tp-size", str(self.tp_size), "--log-level", self.log_level, *self.rank_faults.argv()]
            # stderr is the server's: the ranks' lines land in the same log, as SGLang's do
            self.procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE))

    def wait_joined(self) -> None:
        """Block until every rank has its KV pool ("ready"); a rank that exits first ends the launch as a
        child's SIGQUIT does in SGLang. NCCL init that never ends blocks here for good, as it does there."""
        waiting = dict(enumerate(self.procs))
        while waiting:
            for rank, proc in list(waiting.items()):
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if line == READY:
                    del waiting[rank]
                    continue
                proc.wait()
                logger.error("Received sigquit from a child process. It usually means the child failed.")
                self.kill()
                faults.kill_process_tree(include_parent=True)
        threading.Thread(target=self._watch, name="subprocess-watchdog", daemon=True).start()

    def request_arrived(self) -> None:
        with self._lock:
            self.requests += 1

    def step(self) -> None:
        """One forward on every rank: each must answer before a token comes out (a collective). A stopped rank
        blocks this until SGLang's watchdog (--watchdog-timeout) ends the server."""
        with self._lock:
            message = f"s{self.requests}\n".encode()
            self._stepping = True
        try:
            for proc in self.procs:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(message)
                    proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    self._stall_until_watched()
            selector = selectors.DefaultSelector()
            for proc in self.procs:
                assert proc.stdout is not None
                selector.register(proc.stdout, selectors.EVENT_READ, proc)
            pending = len(self.procs)
            deadline = time.monotonic() + self.watchdog_timeout_s
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._watchdog_timeout()
                for key, _ in selector.select(timeout=min(left, 1.0)):
                    proc = key.data
                    assert proc.stdout is not None
                    if proc.stdout.readline() != ACK:
                        selector.unregister(key.fileobj)
                        self._stall_until_watched()
                    else:
                        pending -= 1
            selector.close()
        finally:
            self._stepping = False

    def _stall_until_watched(self) -> None:
        """A rank died under a collective: the others wait on it; the watchdog thread ends the server."""
        while True:
            time.sleep(3600)

    def _watchdog_timeout(self) -> None:
        """SGLang's utils/watchdog.py after --watchdog-timeout seconds of one forward: log, kill the tree."""
        logger.error("Scheduler watchdog timeout (self.watchdog_timeout=%g, self.soft=False)",
                     self.watchdog_timeout_s)
        self.kill()
        faults.kill_process_tree(include_parent=True)

    def _watch(self) -> None:
        """SGLang's subprocess watchdog: a scheduler child that exits ends the server, naming it."""
        while True:
            for rank, proc in enumerate(self.procs):
                code = proc.poll()
                if code is not None:
                    logger.error("Subprocess scheduler_%d (pid=%d) crashed with exit code %d. Triggering "
                                 "SIGQUIT for cleanup...", rank, proc.pid, code)
                    self.kill()
                    self.on_death()
                    return
            time.sleep(0.1)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()


# ---- the rank process -------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """A rank never outlives its server (SGLang's kill_itself_when_parent_died)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
        os._exit(0)


def _title(rank: int) -> None:
    """`sglang::scheduler_TP{rank}`, as SGLang's setproctitle call (ps, /proc/PID/cmdline)."""
    try:
        import setproctitle
    except ImportError:  # comm only (15 characters): 'sglang::schedul'
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(15, f"sglang::scheduler_TP{rank}".encode(), 0, 0, 0)
        return
    setproctitle.setproctitle(f"sglang::scheduler_TP{rank}")


def _rank_logger(rank: int, level: str) -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s TP{rank}] %(message)s", DATEFMT))
    log = logging.getLogger(f"pytest_dflash.refserver.rank{rank}")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(level.upper())
    return log


def _parse_at(raw: str | None) -> tuple[int, int | None] | None:
    if raw is None:
        return None
    rank, _, after = raw.partition("@")
    return int(rank), int(after) if after else None


def _allocate_kv_cache(rank: int, oom_rank: int | None) -> None:
    if rank == oom_rank:
        # model_runner.py (init_memory_pool) when this GPU has too little left: another process holds it
        raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static. Current value: "
                           "mem_fraction_static=0.85")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m pytest_dflash.refserver.ranks")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--tp-size", type=int, required=True)
    p.add_argument("--log-level", default="info")
    p.add_argument("--crash")
    p.add_argument("--hang")
    p.add_argument("--oom", type=int)
    p.add_argument("--nccl-init-hang", action="store_true")
    args = p.parse_args(argv)
    _die_with_parent()
    _title(args.rank)
    log = _rank_logger(args.rank, args.log_level)
    crash, hang = _parse_at(args.crash), _parse_at(args.hang)
    started = time.monotonic()
    log.info("Init torch distributed begin.")
    if args.nccl_init_hang:
        while True:  # a peer that never joins the NCCL communicator: init_process_group waits for good
            time.sleep(3600)
    try:
        if crash is not None and crash[0] == args.rank and crash[1] is None:
            raise RuntimeError(f"NCCL error in: init, unhandled cuda error (run with NCCL_DEBUG=INFO for "
                               f"details), NCCL version 2.27.7 (rank {args.rank})")
        log.info("Init torch distributed ends. elapsed=%.2f s, mem usage=0.09 GB", time.monotonic() - started)
        log.info("Load weight begin. avail mem=139.13 GB")
        log.info("Load weight end. elapsed=0.01 s, type=RefTinyForCausalLM, avail mem=139.12 GB, "
                 "mem usage=0.01 GB.")
        _allocate_kv_cache(args.rank, args.oom)
        log.info("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 8192, K size: 0.01 GB, "
                 "V size: 0.01 GB")
        log.info("Memory pool end. avail mem=139.10 GB")
    except Exception:
        log.error("Scheduler hit an exception: %s", traceback.format_exc())
        sys.exit(1)
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    out.write(READY)
    out.flush()
    for line in inp:
        requests = int(line[1:] or 0)
        if crash is not None and crash[0] == args.rank and crash[1] is not None and requests >= crash[1]:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or an Xid takes a rank: no last words
        if hang is not None and hang[0] == args.rank and hang[1] is not None and requests >= hang[1]:
            os.kill(os.getpid(), signal.SIGSTOP)  # stopped inside a collective: the engine wedges
        out.write(ACK)
        out.flush()


if __name__ == "__main__":
    main()
