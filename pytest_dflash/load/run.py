"""The load generator's entry point, :func:`run_load`: one event loop (:mod:`.loop`), or ``client_procs``
processes (:mod:`.procs`) merged into one result."""

from __future__ import annotations

from collections.abc import Mapping

from pytest_dflash.load.loop import SoFar, run_coro, run_load_async
from pytest_dflash.load.procs import run_load_procs
from pytest_dflash.load.results import LoadResult
from pytest_dflash.load.spec import LoadSpec

__all__ = ["run_load"]


def run_load(base_url: str, spec: LoadSpec, *, headers: Mapping[str, str] | None = None,
             progress: bool | None = None, keep_token_times: bool = False,
             so_far: SoFar | None = None, so_far_every_s: float = 10.0) -> LoadResult:
    """Drive ``base_url`` with ``spec`` on a fresh event loop and return the measured result.

    ``headers`` are sent with every request (e.g. an Authorization header). ``progress``: None =
    a progress bar on stderr when it is a terminal and the run lasts more than 2 s; True/False
    force it. ``so_far`` is called every ``so_far_every_s`` on the loop's thread with the measured requests
    done and failed, their output tokens and the seconds since the start (one client process only: the
    pytest progress lines). ``keep_token_times`` records each token event's arrival (for tokens/s-over-time
    plots). Uses uvloop when ``PYTEST_DFLASH_UVLOOP=1`` and uvloop is importable. ``spec.client_procs`` > 1
    spreads the run over that many processes (:mod:`.procs`; no progress bar then), merged into one result.
    """
    if spec.client_procs > 1:
        return run_load_procs(base_url, spec, headers=headers, keep_token_times=keep_token_times)
    return run_coro(run_load_async(base_url, spec, headers=headers, progress=progress,
                                    keep_token_times=keep_token_times, so_far=so_far,
                                    so_far_every_s=so_far_every_s))
