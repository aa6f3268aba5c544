"""Helpers shared by the refserver tests (a module, not conftest, so tests can import them)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.refserver.scheduler import Output, Request, Scheduler
from pytest_dflash.refserver.spec import Engine, SamplingParams

DATA = Path(__file__).resolve().parents[1] / "data" / "sglang-0.5.17-h200"


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    seed: int = 0


def run_jobs(engine: Engine, jobs: list[Job], *, timeout_s: float = 120.0) -> list[Output]:
    """Run jobs through a real Scheduler thread (interleaved, stop rules and all); final outputs."""
    sched = Scheduler(
        engine,
        max_running_requests=64,
        decode_log_interval=10**9,
        sampling_backend="pytorch",
        context_length=engine.target.config.context_length,
        die_on_error=False,
    )
    results: list[Output | None] = [None] * len(jobs)
    done = threading.Event()
    lock = threading.Lock()

    def deliver_for(i: int) -> Any:
        def deliver(out: Output) -> None:
            if out.finish is not None:
                with lock:
                    results[i] = out
                    if all(r is not None for r in results):
                        done.set()

        return deliver

    deadline = time.monotonic() + timeout_s
    sched.start()
    try:
        for i, job in enumerate(jobs):
            sched.submit(Request(f"job-{i}", job.prompt, job.params, job.seed, deliver_for(i)))
        while not done.wait(0.05):
            assert sched.error is None, f"the scheduler died: {sched.error!r}"
            assert time.monotonic() < deadline, "the scheduler did not finish every job in time"
    finally:
        sched.shutdown()
        sched.join(timeout=10)
    return [r for r in results if r is not None]


# ---- HTTP against a refserver process, and comparing answers with recorded SGLang ones ----------------

TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def post(server: RefServerProcess, path: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=TIMEOUT, **kw)


def get(server: RefServerProcess, path: str, **kw: Any) -> httpx.Response:
    return httpx.get(server.url + path, timeout=TIMEOUT, **kw)


def assert_same_shape(ours: object, theirs: object, where: str = "$") -> None:
    """Same keys in the same order and the same kinds of values, recursively; null matches anything
    (SGLang itself fills e.g. cached_tokens_details only when there are cached tokens)."""
    __tracebackhide__ = True
    if ours is None or theirs is None:
        return
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{where}: {type(ours).__name__}, recorded an object"
        assert list(ours) == list(theirs), f"{where}: keys {list(ours)} != recorded {list(theirs)}"
        for key in theirs:
            assert_same_shape(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), f"{where}: {type(ours).__name__}, recorded a list"
        if ours and theirs:
            assert_same_shape(ours[0], theirs[0], f"{where}[0]")
    else:
        kind = {bool: "bool", str: "str", int: "number", float: "number"}
        assert kind[type(ours)] == kind[type(theirs)], f"{where}: {ours!r} vs recorded {theirs!r}"
