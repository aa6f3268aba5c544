"""Whatever happens (session end, Ctrl-C, SIGTERM, interpreter exit), what the run provisioned goes away."""

from __future__ import annotations

import atexit
import signal
from types import FrameType

import pytest

from pytest_dflash import interrupts
from pytest_dflash.run.stash import PREVIOUS_SIGINT_KEY, PREVIOUS_SIGTERM_KEY
from pytest_dflash.run.state import DflashRun


def arm(config: pytest.Config, run: DflashRun) -> None:
    """Clean up at exit (the signals are armed already: `arm_signals`)."""
    atexit.register(run.cleanup)


def arm_signals(config: pytest.Config) -> None:
    """From the run's first moment (report/started.py): turn SIGTERM into KeyboardInterrupt so pytest tears
    down as on Ctrl-C — also during pytest_configure — and latch both signals (pytest_dflash.interrupts), so
    one that a finalizer swallows still stops the run."""
    if not interrupts.in_main_thread() or PREVIOUS_SIGTERM_KEY in config.stash:
        return
    interrupts.reset()
    previous = signal.getsignal(signal.SIGTERM)
    config.stash[PREVIOUS_SIGTERM_KEY] = previous
    config.stash[PREVIOUS_SIGINT_KEY] = interrupts.install_sigint()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        interrupts.on_signal(signum, frame)  # raises KeyboardInterrupt: pytest then tears down like Ctrl-C

    signal.signal(signal.SIGTERM, on_sigterm)


def disarm(config: pytest.Config, run: DflashRun | None) -> None:
    """Session over: clean up now and put the previous SIGTERM handler back."""
    if run is not None:
        run.cleanup()
        atexit.unregister(run.cleanup)
    previous = config.stash.get(PREVIOUS_SIGTERM_KEY, None)
    if previous is not None and interrupts.in_main_thread():
        signal.signal(signal.SIGTERM, previous)
    previous_sigint = config.stash.get(PREVIOUS_SIGINT_KEY, None)
    if previous_sigint is not None and interrupts.in_main_thread():
        signal.signal(signal.SIGINT, previous_sigint)
    forget_handled_interrupt()


def forget_handled_interrupt() -> None:
    """Clear CPython's 'unhandled KeyboardInterrupt' mark of an interrupt pytest has handled.

    Before 3.14 (gh-128130), a KeyboardInterrupt that leaves code run by exec() of a string — a dataclass's
    generated __init__ being built, say — sets that mark even when a caller catches it, and the interpreter
    then exits by SIGINT (status -2) instead of pytest's 2 for an interrupted run. Every exec() of a string
    clears the mark first, so one empty exec forgets it. A later, really unhandled interrupt sets it again.
    """
    exec("None")  # a constant: the point is the call, see above

