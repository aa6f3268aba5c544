"""Self-awareness of the client: an event-loop lag ticker, loop-thread and process CPU, the progress
line, and the verdict whether the client itself was the bottleneck (:class:`Saturation`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import numpy as np

from pytest_dflash.load.results import RequestRecord, Saturation
from pytest_dflash.load.spec import LoadSpec


class Monitor:
    """Ticks every ``interval_s``: loop lag, progress line. Reads loop-thread and process CPU."""

    def __init__(self, *, interval_s: float = 0.01, progress: bool, total: int | None,
                 duration_s: float | None) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self.progress = progress
        self.total = total
        self.duration_s = duration_s
        self._task: asyncio.Task[None] | None = None
        self._t0_wall = 0.0
        self._t0_thread = 0.0
        self._t0_proc = 0.0
        self.loop_cpu = 0.0
        self.process_cpu = 0.0
        self._shown = False
        self.done = self.errors = self.tokens = 0  # measured requests finished (kept incrementally)

    def finished(self, rec: RequestRecord) -> None:
        """Count one finished request for the progress line (O(1): no scan of the records)."""
        if not rec.warmup:
            self.done += 1
            self.errors += rec.error is not None
            self.tokens += rec.output_tokens or 0

    def start(self) -> None:
        self._t0_wall = time.perf_counter()
        self._t0_thread = time.thread_time()
        self._t0_proc = time.process_time()
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval_s
        last_draw = 0.0
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            loop.call_at(next_at, set_none, fut)
            await fut
            now = loop.time()
            self.lags_ms.append((now - next_at) * 1e3)
            next_at = max(next_at + self.interval_s, now)
            if self.progress and now - last_draw >= 0.25:
                last_draw = now
                self._draw()

    def _draw(self) -> None:
        elapsed = time.perf_counter() - self._t0_wall
        if elapsed < 2.0 and not self._shown:
            return
        self._shown = True
        done, errs, toks = self.done, self.errors, self.tokens
        if self.total:
            frac = min(done / self.total, 1.0)
        elif self.duration_s:
            frac = min(elapsed / self.duration_s, 1.0)
        else:
            frac = 0.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r[{bar:<30}] {done} req  {elapsed:6.1f} s  {toks / max(elapsed, 1e-9):10,.0f} "
                         f"tok/s  errors {errs}  ")
        sys.stderr.flush()

    async def stop(self) -> None:
        wall = time.perf_counter() - self._t0_wall
        self.loop_cpu = (time.thread_time() - self._t0_thread) / wall if wall > 0 else 0.0
        self.process_cpu = (time.process_time() - self._t0_proc) / wall if wall > 0 else 0.0
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._shown:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


def set_none(fut: asyncio.Future[None]) -> None:
    """Wake a sleeper at its ``loop.call_at`` time (unless it was cancelled meanwhile)."""
    if not fut.done():
        fut.set_result(None)


def saturation_of(spec: LoadSpec, mon: Monitor, schedule_lags_ms: list[float]) -> Saturation:
    """Was the client the bottleneck of this one-loop run? Loop lag, loop CPU and open-loop send lag vs the
    spec."""
    lags = np.asarray(mon.lags_ms or [0.0])
    p50, p99 = (float(x) for x in np.percentile(lags, [50, 99]))
    sat = Saturation(loop_lag_p50_ms=p50, loop_lag_p99_ms=p99, loop_lag_max_ms=float(lags.max()),
                     loop_cpu=mon.loop_cpu, process_cpu=mon.process_cpu)
    if schedule_lags_ms:
        sat.schedule_lag_p99_ms = float(np.percentile(schedule_lags_ms, 99))
    return judge_saturation(sat, spec)


def judge_saturation(sat: Saturation, spec: LoadSpec) -> Saturation:
    """The closed-loop rule over the figures `sat` recorded (loop lag p99, loop CPU, open-loop send lag p99)
    against the spec's limits: `sat` with its reasons and verdict set (a recorded run can be judged again)."""
    sat.reasons = []
    if sat.loop_lag_p99_ms > spec.max_loop_lag_ms:
        sat.reasons.append(f"event-loop lag p99 {sat.loop_lag_p99_ms:.1f} ms > {spec.max_loop_lag_ms:g} ms")
    if sat.loop_cpu >= spec.max_client_cpu:
        sat.reasons.append(f"client event loop used {sat.loop_cpu:.2f} cores >= {spec.max_client_cpu:g}")
    if sat.schedule_lag_p99_ms is not None and sat.schedule_lag_p99_ms > spec.max_loop_lag_ms:
        sat.reasons.append(f"open-loop send lag p99 {sat.schedule_lag_p99_ms:.1f} ms > "
                           f"{spec.max_loop_lag_ms:g} ms")
    sat.saturated = bool(sat.reasons)
    return sat
