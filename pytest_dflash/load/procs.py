"""One load run spread over several client processes (``LoadSpec.client_procs``), merged into one result.

Why: one event loop streams about one core's worth of tokens (benchmarks/README.md); a server that
streams more than that needs more clients, or the run measures the client. Each process is a
``spawn``-ed interpreter with its own event loop and connection pool, and runs
:func:`~pytest_dflash.load.loop.run_load_async` on its part of the run:

* request *i* (warm-up first, then measured, numbered as in a one-process run) is sent by process
  ``i % N``, built from the same spec and seed, so prompts, lengths and ids are those of the
  one-process run; open loop: every process draws the whole seeded arrival schedule and sends its
  own arrivals, so the schedule is the one-process schedule too;
* requests in flight (and an open loop's cap) are split as evenly as they go (8 over 3: 3, 3, 2);
* every process stamps against one clock origin (``perf_counter_ns`` is CLOCK_MONOTONIC, shared by
  the machine's processes), warms up, then waits for the others: the measured phase starts at one
  instant in every process, and a ``duration`` run ends at one instant;
* the records are merged (by index) and aggregated as one run's; ``/flush_cache`` and
  ``/server_info`` are sent once, by the parent; the saturation of the run is the worst process's,
  and one saturated process saturates the run (:class:`~pytest_dflash.load.results.Saturation`).

Nothing waits unbounded: start-up (``start_timeout_s``), the warm-up and the run (the spec's
deadline plus a margin) are bounded, and every wait watches the processes' sentinels, so a process
that dies ends the run at once with :class:`ClientProcessError` (exit code, the traceback's or its
stderr's last lines). SIGINT/SIGTERM to the parent stop every process first (the children ignore
SIGINT, and exit on their own when the parent disappears).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from pytest_dflash.load.loop import Share, run_coro, run_load_async
from pytest_dflash.load.results import LoadResult, Saturation, aggregate
from pytest_dflash.load.serverinfo import flush_cache, server_accept_length
from pytest_dflash.load.spec import LoadSpec

__all__ = ["ClientProcessError", "merge_results", "run_load_procs"]

START_TIMEOUT_S = 60.0  # a spawn-ed interpreter importing numpy + httpx: ~0.5 s idle, a few s on a busy box
RESULT_MARGIN_S = 30.0  # after the spec's deadline: the records' trip back through the pipe


class ClientProcessError(RuntimeError):
    """A load client process failed (died, raised, or did not start in time): the run has no result."""


class _Interrupted(BaseException):
    """SIGTERM reached the parent during the run: children are stopped, then the signal is re-raised."""


# ------------------------------------------------------------------------------------------------
# The child
# ------------------------------------------------------------------------------------------------


def _recv(conn: multiprocessing.connection.Connection, timeout_s: float, what: str) -> Any:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"no {what} from the parent within {timeout_s:.0f} s")
    return conn.recv()


def _watch_parent(parent: int) -> None:
    """Exit when the parent is gone (it was SIGKILLed): a load client never outlives its run."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(3)


def _child(conn: multiprocessing.connection.Connection, index: int, of: int, base_url: str, spec: LoadSpec,
           headers: Mapping[str, str] | None, keep_token_times: bool, stamped: bool, stderr_path: str,
           parent: int) -> None:
    """Entry point of client process ``index`` (spawn): ready → go → warm → measure → result."""
    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)  # the parent quotes its tail when this process dies
    os.close(fd)
    faulthandler.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    threading.Thread(target=_watch_parent, args=(parent,), name="watch-parent", daemon=True).start()
    deadline_s = spec.deadline_s() + RESULT_MARGIN_S
    try:
        conn.send(("ready", os.getpid()))
        _, t0_ns = _recv(conn, START_TIMEOUT_S * 2, "start signal")

        async def measure() -> int:
            conn.send(("warm", None))
            loop = asyncio.get_running_loop()  # wait in a thread: the loop (and its lag ticker) stays free
            _, start_ns = await loop.run_in_executor(None, _recv, conn, deadline_s, "measure signal")
            return int(start_ns)

        share = Share(index=index, of=of, t0_ns=int(t0_ns), measure=measure)
        result = run_coro(run_load_async(base_url, spec, headers=headers, progress=False,
                                          keep_token_times=keep_token_times, stamped=stamped, share=share))
        conn.send(("result", result))
    except BaseException:
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", traceback.format_exc()))
        sys.stderr.flush()
        os._exit(1)
    conn.close()


# ------------------------------------------------------------------------------------------------
# The parent
# ------------------------------------------------------------------------------------------------


def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Pool:
    """The client processes of one run, their pipes and stderr files; ``close()`` stops what is left."""

    def __init__(self, n: int, base_url: str, spec: LoadSpec, headers: Mapping[str, str] | None,
                 keep_token_times: bool, stamped: bool) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.n = n
        self.conns: list[multiprocessing.connection.Connection] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.logs: list[Path] = []
        self.phase = "start-up"
        try:
            for k in range(n):
                fd, log = tempfile.mkstemp(prefix=f"dflash-load-{k + 1}-", suffix=".stderr")
                os.close(fd)
                self.logs.append(Path(log))
                mine, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=_child, name=f"dflash-load-{k + 1}", daemon=True,
                                   args=(theirs, k, n, base_url, spec, dict(headers or {}), keep_token_times,
                                         stamped, log, os.getpid()))
                proc.start()
                theirs.close()
                self.conns.append(mine)
                self.procs.append(proc)
        except BaseException:
            self.close()
            raise

    def gather(self, kind: str, timeout_s: float) -> list[Any]:
        """One ``kind`` message from every process within ``timeout_s``; a death or an error ends it at
        once."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < self.n:
            waiting = [k for k in range(self.n) if k not in got]
            left = deadline - time.monotonic()
            if left <= 0:
                late = ", ".join(str(k + 1) for k in waiting)
                raise ClientProcessError(f"load client process(es) {late} of {self.n} sent no {kind!r} "
                                         f"within {timeout_s:.0f} s ({self.phase})")
            handles: list[Any] = [self.conns[k] for k in waiting] + [self.procs[k].sentinel for k in waiting]
            ready = multiprocessing.connection.wait(handles, timeout=min(left, 1.0))
            for k in waiting:
                if self.conns[k] in ready or self.procs[k].sentinel in ready:
                    message = self._read(k)
                    if message is None:
                        raise self._died(k)
                    tag, payload = message
                    if tag == "error":
                        raise ClientProcessError(f"load client process {k + 1} of {self.n} (pid "
                                                 f"{self.procs[k].pid}) failed during {self.phase}: "
                                                 f"{_tail(str(payload))}")
                    if tag != kind:
                        raise ClientProcessError(f"load client process {k + 1} of {self.n} sent {tag!r}, "
                                                 f"expected {kind!r} ({self.phase})")
                    got[k] = payload
        return [got[k] for k in range(self.n)]

    def _read(self, k: int) -> tuple[str, Any] | None:
        conn = self.conns[k]
        try:
            if conn.poll(0):
                message: tuple[str, Any] = conn.recv()
                return message
        except (EOFError, OSError):
            return None
        return None  # the sentinel fired and nothing is left in the pipe: it died

    def _died(self, k: int) -> ClientProcessError:
        proc = self.procs[k]
        proc.join(timeout=2.0)
        try:
            stderr = self.logs[k].read_text(encoding="utf-8", errors="replace")
        except OSError:
            stderr = ""
        tail = _tail(stderr)
        hint = ""
        if self.phase == "start-up" and not tail:
            hint = (" (its start-up traceback is on this process's stderr; a script that runs client "
                    "processes must guard its entry point with `if __name__ == \"__main__\":`, "
                    "multiprocessing's spawn rule)")
        return ClientProcessError(f"load client process {k + 1} of {self.n} (pid {proc.pid}) died during "
                                  f"{self.phase}: {_exit_text(proc.exitcode)}"
                                  + (f"; stderr: {tail}" if tail else f"; nothing on its stderr{hint}"))

    def send(self, message: tuple[str, Any]) -> None:
        for k, conn in enumerate(self.conns):
            try:
                conn.send(message)
            except OSError:
                raise self._died(k) from None

    def close(self) -> None:
        """Stop every process still running (TERM, then KILL after 5 s), close the pipes, drop the files."""
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        stop_by = time.monotonic() + 5.0
        for proc in self.procs:
            proc.join(timeout=max(stop_by - time.monotonic(), 0.05))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
        for conn in self.conns:
            conn.close()
        for log in self.logs:
            log.unlink(missing_ok=True)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the run lasts, SIGTERM raises in the main thread (so the children are stopped), then is
    re-raised."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return
    hit = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal hit
        if not hit:  # once: a second TERM must not interrupt the children's clean-up
            hit = True
            raise _Interrupted()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except _Interrupted:
        signal.signal(signal.SIGTERM, previous)
        signal.raise_signal(signal.SIGTERM)  # the process ends as it would have, its children already gone
        raise ClientProcessError("the load run was stopped by SIGTERM (its client processes too)") from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_load_procs(base_url: str, spec: LoadSpec, *, headers: Mapping[str, str] | None = None,
                   keep_token_times: bool = False, stamped: bool = True,
                   start_timeout_s: float = START_TIMEOUT_S) -> LoadResult:
    """Run ``spec`` over ``spec.client_procs`` processes and merge their records into one
    :class:`LoadResult`."""
    base_url = base_url.rstrip("/")
    n = spec.client_procs
    notes: list[str] = []
    if spec.server_accept_length and not asyncio.run(flush_cache(base_url, headers=headers)):
        notes.append("/flush_cache refused (server busy): server_accept_length includes earlier requests")
    with _sigterm_raises():
        pool = _Pool(n, base_url, spec, headers, keep_token_times, stamped)
        try:
            pool.gather("ready", start_timeout_s)
            pool.phase = "the warm-up"
            pool.send(("go", time.perf_counter_ns()))
            run_s = spec.deadline_s() + RESULT_MARGIN_S
            pool.gather("warm", run_s)
            pool.phase = "the measured phase"
            pool.send(("measure", time.perf_counter_ns()))
            parts: list[LoadResult] = pool.gather("result", run_s)
        finally:
            pool.close()
    server_acc: float | None = None
    if spec.server_accept_length:
        try:
            server_acc = asyncio.run(server_accept_length(base_url, headers=headers))
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: not JSON, or nested too deep
            notes.append(f"/server_info failed: {type(exc).__name__}: {exc}")
    return merge_results(base_url, spec, parts, server_accept_length=server_acc, notes=notes)


def merge_results(base_url: str, spec: LoadSpec, parts: list[LoadResult], *,
                  server_accept_length: float | None, notes: list[str] | None = None) -> LoadResult:
    """One run's result from its processes' parts: records by index, one run's aggregates, the worst
    saturation."""
    records = sorted((r for part in parts for r in part.records), key=lambda r: r.index)
    out_notes = list(notes or [])
    for k, part in enumerate(parts):
        out_notes += [f"client process {k + 1} of {len(parts)}: {note}" for note in part.notes]
    metrics, errors = aggregate(records, slo=spec.slo, max_concurrency=spec.effective_concurrency(),
                                server_accept_length=server_accept_length)
    return LoadResult(spec=spec, base_url=base_url, records=records, metrics=metrics, errors_by_kind=errors,
                      saturation=merge_saturation([p.saturation for p in parts]),
                      server_accept_length=server_accept_length,
                      start_wall=min((p.start_wall for p in parts), default=0.0),
                      end_wall=max((p.end_wall for p in parts), default=0.0), notes=out_notes)


def merge_saturation(parts: list[Saturation]) -> Saturation:
    """The run's saturation: each rule was applied per process (one loop each); any saturated process
    saturates it."""
    n = len(parts)
    sat = Saturation(processes=n)
    if not parts:
        return sat
    sat.loop_lag_p50_ms = max(p.loop_lag_p50_ms for p in parts)
    sat.loop_lag_p99_ms = max(p.loop_lag_p99_ms for p in parts)
    sat.loop_lag_max_ms = max(p.loop_lag_max_ms for p in parts)
    sat.loop_cpu = max(p.loop_cpu for p in parts)
    sat.process_cpu = sum(p.process_cpu for p in parts)
    lags = [p.schedule_lag_p99_ms for p in parts if p.schedule_lag_p99_ms is not None]
    sat.schedule_lag_p99_ms = max(lags) if lags else None
    for k, part in enumerate(parts, 1):
        if part.saturated:
            sat.saturated_processes.append(k)
            sat.reasons += [f"client process {k} of {n}: {reason}" for reason in part.reasons]
    sat.saturated = bool(sat.saturated_processes)
    return sat
