"""Hosts in parallel (one process, no xdist): before the first test, every host's services are brought to ready —
or to a recorded failure — concurrently, at most --fleet-concurrency hosts at a time, instead of host after host
as the tests reach them. A fleet's hosts spend their readiness mostly waiting (a first sampled request took
80-256 s per SGLang process on the H200), so the waits overlap. Nothing else changes: each service's outcome is
kept on its handle and the first test that needs it passes or fails with it, layers still block per host, each
host keeps its own lock, evidence window and teardown. Under xdist the controller gives each host to a fixed worker
(fleet/scheduling.py) and each worker runs this over the hosts it owns (`hosts=`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Collection

from pytest_dflash import interrupts
from pytest_dflash.errors import DflashError
from pytest_dflash.run.state import DflashRun, HostContext

DEFAULT_CONCURRENCY = 8


HostProbe = Callable[[HostContext], None]


def _bring_up(host: HostContext, probe: HostProbe | None) -> None:
    for name in sorted(host.needed):
        with contextlib.suppress(DflashError):  # kept on the handle: the first test that needs it fails with it
            host.service(name).ensure_ready()
    if probe is not None:
        probe(host)


def preflight(run: DflashRun, concurrency: int, *, hosts: Collection[str] | None = None, who: str = "",
              probe: HostProbe | None = None) -> None:
    """Ready every needed service of every host (of `hosts` only, if given), `concurrency` hosts at a time;
    a no-op for fewer than 2 such hosts. `who` names the xdist worker in the progress lines.

    `probe` runs after its services on each host whose selected tests read its GPUs (`gpu_tested`): host-side
    probes the tests will read from a cache (the GPU inventory over ssh), so they overlap across hosts too. It
    records its own failures.
    """
    names = [name for name in run.profiles if hosts is None or name in hosts]
    chosen = [run.host(name) for name in names
              if run.host(name).needed or (probe is not None and run.host(name).gpu_tested)]
    if concurrency < 2 or len(chosen) < 2:
        return
    label = f"fleet pre-flight{f' ({who})' if who else ''}"
    started = time.monotonic()
    run.progress(f"{label}: readying {len(chosen)} hosts, {min(concurrency, len(chosen))} at a time "
                 "(--fleet-concurrency)")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(concurrency, len(chosen)),
                                                 thread_name_prefix="dflash-preflight")
    try:
        futures = [pool.submit(_bring_up, host, probe if host.gpu_tested else None) for host in chosen]
        pending = set(futures)
        while pending:  # short waits: an interrupt a finalizer swallowed is raised again here
            _, pending = concurrent.futures.wait(pending, timeout=0.25)
            interrupts.raise_if_lost()
        for future in futures:
            future.result()  # a bug in a thread surfaces here, not silently
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # Ctrl-C: the run's cleanup stops what was started
    failed = sum(1 for host in chosen for handle in host.services.values() if handle.failure is not None)
    run.progress(f"{label}: {len(chosen)} hosts in {time.monotonic() - started:.1f}s, "
                 f"{failed} service(s) not ready")


__all__ = ["DEFAULT_CONCURRENCY", "HostProbe", "preflight"]
