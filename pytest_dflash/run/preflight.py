"""Hosts in parallel: every host's services are brought to ready — or to a recorded failure — concurrently, at
most --fleet-concurrency hosts at a time, instead of host after host as the tests reach them. A fleet's hosts
spend their readiness mostly waiting (a first sampled request took 80-256 s per SGLang process on the H200),
so the waits overlap.

The bring-ups run behind the tests, not before them: they start in the order the tests will reach the hosts,
and a host's first test waits for its own host's bring-up only (`wait_for_host`), so the first host's tests
run while the others still come up (held back until the last host was ready, a 32-host fleet worker on the
device sat idle 0.5-2.6 s before its first test). Nothing else changes: each service's outcome is kept on its
handle and the first test that needs it passes or fails with it, layers still block per host, each host keeps
its own lock, evidence window and teardown, and no test of a host runs while its bring-up does. When the run
ends early (-x, Ctrl-C, SIGTERM) its cleanup drops the bring-ups not begun and ends the readiness waits of
those begun (the process exits only when these threads do). Under xdist the controller gives each host to a
fixed worker (fleet/scheduling.py) and each worker runs this over the hosts it owns (`hosts=`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Collection

from pytest_dflash import interrupts
from pytest_dflash.errors import DflashError
from pytest_dflash.run.state import DflashRun, HostContext

DEFAULT_CONCURRENCY = 8


HostProbe = Callable[[HostContext], None]


def _bring_up(host: HostContext, probe: HostProbe | None) -> None:
    for name in sorted(host.needed):
        if host.run.cleaning:  # the run ended (-x, Ctrl-C): its process exits only when this thread does
            return
        # kept on the handle: the first test that needs it fails with it
        with contextlib.suppress(DflashError):
            host.service(name).ensure_ready()
    if probe is not None and not host.run.cleaning:
        probe(host)


def preflight(run: DflashRun, concurrency: int, *, hosts: Collection[str] | None = None, who: str = "",
              probe: HostProbe | None = None) -> None:
    """Start readying every needed service of every host (of `hosts` only, if given), `concurrency` hosts at a
    time, in the run's host order (the order of the tests); returns at once. A no-op for fewer than 2 such
    hosts. `who` names the xdist worker in the progress lines.

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
    # The run's cleanup (session end, Ctrl-C, SIGTERM) drops the bring-ups not begun; a begun one ends on its
    # own (a provisioned service it started is stopped by that cleanup, and none is started after it:
    # prestart).
    run.on_cleanup(lambda: pool.shutdown(wait=False, cancel_futures=True))
    left = [len(chosen)]
    lock = threading.Lock()

    def finished(_: concurrent.futures.Future[None]) -> None:
        with lock:
            left[0] -= 1
            if left[0] or run.cleaning:  # cancelled by the run's cleanup: not "N hosts in Xs"
                return
        failed = sum(1 for host in chosen for handle in host.services.values() if handle.failure is not None)
        run.progress(f"{label}: {len(chosen)} hosts in {time.monotonic() - started:.1f}s, "
                     f"{failed} service(s) not ready")

    for host in chosen:
        host.bring_up = pool.submit(_bring_up, host, probe if host.gpu_tested else None)
        host.bring_up.add_done_callback(finished)
    pool.shutdown(wait=False)  # no more work; the threads end with the last bring-up


def wait_for_host(host: HostContext) -> None:
    """Before a test of `host`: its bring-up has ended (at once if it has, or if it has none). Short waits, so
    an interrupt a finalizer swallowed is raised again here; a bug in the bring-up is raised here, in each of
    the host's tests, not silently; a bring-up the run's cleanup cancelled is no wait."""
    future = host.bring_up
    if future is None:
        return
    while True:
        try:
            future.result(timeout=0.25)
            break
        except concurrent.futures.TimeoutError:
            interrupts.raise_if_lost()
        except concurrent.futures.CancelledError:
            break
    host.bring_up = None


__all__ = ["DEFAULT_CONCURRENCY", "HostProbe", "preflight", "wait_for_host"]
