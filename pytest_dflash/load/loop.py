"""One load run on one event loop: closed loop or seeded Poisson arrivals, warm-up, the run deadline,
the server's accept length read around it (:func:`run_load_async`), and one process's part of a run
spread over several (:class:`Share`, used by :mod:`.procs`)."""

from __future__ import annotations

import asyncio
import importlib
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from pytest_dflash.load.monitor import Monitor, saturation_of, set_none
from pytest_dflash.load.results import ErrorKind, LoadResult, RequestError, RequestRecord, aggregate
from pytest_dflash.load.serverinfo import flush_cache, server_accept_length
from pytest_dflash.load.spec import ENDPOINT_PATHS, LoadSpec
from pytest_dflash.load.sse import one_request
from pytest_dflash.load.transport import make_client
from pytest_dflash.load.workload import Workload

__all__ = ["Share", "SoFar", "run_coro", "run_load_async"]


@dataclass(frozen=True)
class Share:
    """This process's part of a run spread over ``of`` client processes (:mod:`.procs`).

    Request *i* belongs to process ``i % of``; every process builds it from the same spec and seed, so
    it is the same request as in a one-process run. ``t0_ns`` is the run's common clock origin
    (``perf_counter_ns`` is CLOCK_MONOTONIC, one clock for every process of the machine);
    ``measure()`` is awaited after the warm-up: it returns when every process is warm, with the
    measured phase's common start.
    """

    index: int
    of: int
    t0_ns: int
    measure: Callable[[], Awaitable[int]]


def _part(total: int | None, index: int, of: int) -> int | None:
    """Process ``index``'s part of ``total`` slots (in flight, or None: no cap) over ``of`` processes."""
    if total is None:
        return None
    return total // of + (1 if index < total % of else 0)


def _want_progress(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


SoFar = Callable[[int, int, int, float], None]  # (measured requests done, failed, output tokens, seconds)


async def _report_so_far(monitor: Monitor, so_far: SoFar, every_s: float) -> None:
    started = time.perf_counter()
    while True:
        await asyncio.sleep(every_s)
        so_far(monitor.done, monitor.errors, monitor.tokens, time.perf_counter() - started)


async def run_load_async(base_url: str, spec: LoadSpec, *, headers: Mapping[str, str] | None = None,
                         progress: bool | None = None, keep_token_times: bool = False,
                         so_far: SoFar | None = None, so_far_every_s: float = 10.0,
                         stamped: bool = True, share: Share | None = None) -> LoadResult:
    """Run ``spec`` against ``base_url`` inside the running event loop (see :func:`.run.run_load`).

    One event loop: ``spec.client_procs`` > 1 is :func:`.run.run_load`'s (it starts the processes).
    ``stamped=False`` uses httpx's stock transport instead of the stamped one (``--stock-httpx``);
    ``share`` is set by :mod:`.procs` in each of its processes.
    """
    if spec.client_procs > 1 and share is None:
        raise ValueError(f"run_load_async runs one event loop: use run_load for "
                         f"client_procs={spec.client_procs}")
    base_url = base_url.rstrip("/")
    workload = Workload(spec)
    path = ENDPOINT_PATHS[spec.endpoint]
    own, step = (share.index, share.of) if share is not None else (0, 1)
    limit = _part(spec.effective_concurrency(), own, step)
    server_side = spec.server_accept_length and share is None  # several processes: the parent reads it
    timeout = httpx.Timeout(spec.request_timeout_s, connect=spec.connect_timeout_s)
    records: list[RequestRecord] = []
    notes: list[str] = []
    schedule_lags_ms: list[float] = []
    server_acc: float | None = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spec.deadline_s()
    if server_side and not await flush_cache(base_url, headers=headers):
        notes.append("/flush_cache refused (server busy): server_accept_length includes earlier requests")

    monitor = Monitor(progress=_want_progress(progress), total=spec.num_requests, duration_s=spec.duration_s)
    start_wall = end_wall = time.time()
    async with make_client(base_url, limit=limit, timeout=timeout, headers=headers,
                           stamped=stamped) as client:
        t0_ns = time.perf_counter_ns() if share is None else share.t0_ns
        # Request i is process i % step's: warm-up ids 0..W-1, then measured ids W, W+1, ...
        # (one process: all).
        warm_ids = iter(range(own, spec.warmup_requests, step))
        next_id = spec.warmup_requests + own

        def new_record(warmup: bool) -> tuple[RequestRecord, bytes]:
            nonlocal next_id
            if warmup:
                index = next(warm_ids)
            else:
                index, next_id = next_id, next_id + step
            item = workload.item(index)
            rec = RequestRecord(index=index, warmup=warmup, prompt_len=item.prompt_len,
                                max_tokens=item.max_tokens)
            records.append(rec)
            return rec, workload.body(item)

        async def send(rec: RequestRecord, body: bytes) -> None:
            await one_request(client, path, spec.endpoint, body, rec, t0_ns, spec.strict_json,
                               keep_token_times, spec.request_timeout_s)
            monitor.finished(rec)

        async def guarded(run: Callable[[], Awaitable[None]]) -> None:
            try:
                async with asyncio.timeout_at(deadline):
                    await run()
            except TimeoutError:
                notes.append(f"run deadline ({spec.deadline_s():.0f} s) reached: "
                             f"in-flight requests cancelled")

        monitor.start()
        reporter = (loop.create_task(_report_so_far(monitor, so_far, so_far_every_s))
                    if so_far is not None else None)
        try:
            own_warmup = len(range(own, spec.warmup_requests, step))
            if own_warmup:
                async def warm() -> None:
                    remaining = own_warmup

                    async def worker() -> None:
                        nonlocal remaining
                        while remaining > 0:
                            remaining -= 1
                            await send(*new_record(True))

                    await asyncio.gather(*(worker() for _ in range(min(limit or 8, own_warmup))))

                await guarded(warm)
            if share is not None:
                measure_start_ns = await share.measure()  # every process warm: one common start
            else:
                measure_start_ns = time.perf_counter_ns()
            start_wall = time.time()
            stop_at = None if spec.duration_s is None else measure_start_ns + int(spec.duration_s * 1e9)
            budget = (None if spec.num_requests is None else
                      len(range(spec.warmup_requests + own, spec.warmup_requests + spec.num_requests, step)))

            def more() -> bool:
                nonlocal budget
                if stop_at is not None and time.perf_counter_ns() >= stop_at:
                    return False
                if budget is not None:
                    if budget <= 0:
                        return False
                    budget -= 1
                return True

            if spec.closed_loop:
                async def closed() -> None:
                    async def worker() -> None:
                        while more():
                            await send(*new_record(False))

                    await asyncio.gather(*(worker() for _ in range(limit or 1)))

                await guarded(closed)
            else:
                assert spec.request_rate is not None
                rate = spec.request_rate

                async def open_loop() -> None:
                    arrivals = random.Random(spec.seed ^ 0x5EED_5EED)
                    sem = asyncio.Semaphore(limit) if limit else None
                    tasks: set[asyncio.Task[None]] = set()
                    base = loop.time() - (time.perf_counter_ns() - measure_start_ns) / 1e9
                    planned = 0.0
                    arrival = -1  # every process draws every arrival; it sends those of its own requests

                    async def launch(rec: RequestRecord, body: bytes) -> None:
                        if sem is None:
                            await send(rec, body)
                            return
                        async with sem:
                            await send(rec, body)

                    try:
                        while True:
                            planned += arrivals.expovariate(rate)
                            arrival += 1
                            when = base + planned
                            if stop_at is not None and (measure_start_ns + int(planned * 1e9)) >= stop_at:
                                break
                            if arrival % step != own:
                                continue
                            if not more():
                                break
                            fut: asyncio.Future[None] = loop.create_future()
                            loop.call_at(when, set_none, fut)
                            await fut
                            schedule_lags_ms.append((loop.time() - when) * 1e3)
                            rec, body = new_record(False)
                            rec.scheduled_s = (measure_start_ns - t0_ns) / 1e9 + planned
                            task = loop.create_task(launch(rec, body))
                            tasks.add(task)
                            task.add_done_callback(tasks.discard)
                        if tasks:
                            await asyncio.gather(*tasks)
                    finally:
                        for task in tasks:
                            task.cancel()
                        if tasks:
                            await asyncio.gather(*tasks, return_exceptions=True)

                await guarded(open_loop)
            end_wall = time.time()
        finally:
            if reporter is not None:
                reporter.cancel()
            await monitor.stop()
        for rec in records:  # cancelled at the deadline before a record was finished
            if rec.error is None and rec.output_tokens is None:
                rec.error = RequestError(ErrorKind.CANCELLED, "cancelled at the run deadline")
                if rec.end_s is None:
                    rec.end_s = (time.perf_counter_ns() - t0_ns) / 1e9

    if server_side:
        try:
            server_acc = await server_accept_length(base_url, headers=headers)
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: not JSON, or nested too deep
            notes.append(f"/server_info failed: {type(exc).__name__}: {exc}")
    saturation = saturation_of(spec, monitor, schedule_lags_ms)
    metrics, errors = aggregate(records, slo=spec.slo, max_concurrency=limit, server_accept_length=server_acc)
    return LoadResult(spec=spec, base_url=base_url, records=records, metrics=metrics, errors_by_kind=errors,
                      saturation=saturation, server_accept_length=server_acc, start_wall=start_wall,
                      end_wall=end_wall, notes=notes)


def run_coro(coro: Coroutine[Any, Any, LoadResult]) -> LoadResult:
    """asyncio.run, or uvloop.run when PYTEST_DFLASH_UVLOOP=1 and uvloop is installed."""
    if os.environ.get("PYTEST_DFLASH_UVLOOP") == "1":
        try:
            uvloop = importlib.import_module("uvloop")  # optional
        except ImportError:
            pass
        else:
            result: LoadResult = uvloop.run(coro)
            return result
    return asyncio.run(coro)
