"""Whatever happens (session end, Ctrl-C, SIGTERM or SIGHUP, exit), what the run provisioned goes away."""

from __future__ import annotations

import atexit
import signal
from types import FrameType
from typing import Any

import pytest

from pytest_dflash import interrupts
from pytest_dflash.run.stash import PREVIOUS_SIGINT_KEY, PREVIOUS_SIGNALS_KEY
from pytest_dflash.run.state import DflashRun

# the signals that stop a run the way Ctrl-C does (SIGINT: interrupts.install_sigint)
_ARMED = (signal.SIGTERM, signal.SIGHUP)


def arm(config: pytest.Config, run: DflashRun) -> None:
    """Clean up at exit (the signals are armed already: `arm_signals`)."""
    atexit.register(run.cleanup)


def arm_signals(config: pytest.Config) -> None:
    """From the run's first moment (report/started.py): turn SIGTERM and SIGHUP (a CI runner's cancel, an ssh
    session or terminal that went away) into KeyboardInterrupt so pytest tears down as on Ctrl-C — also during
    pytest_configure — and latch them and SIGINT (pytest_dflash.interrupts), so one that a finalizer swallows
    still stops the run. A SIGHUP that is ignored (`nohup`) stays ignored."""
    if not interrupts.in_main_thread() or PREVIOUS_SIGNALS_KEY in config.stash:
        return
    interrupts.reset()
    previous: dict[signal.Signals, Any] = {}
    config.stash[PREVIOUS_SIGNALS_KEY] = previous
    config.stash[PREVIOUS_SIGINT_KEY] = interrupts.install_sigint()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        signal.signal(sig, previous.get(sig) or signal.SIG_DFL)  # a second one acts as it would have
        interrupts.on_signal(signum, frame)  # raises KeyboardInterrupt: pytest then tears down like Ctrl-C

    for sig in _ARMED:
        handler = signal.getsignal(sig)
        if sig is signal.SIGHUP and handler is signal.SIG_IGN:
            continue
        previous[sig] = handler
        signal.signal(sig, on_signal)


def disarm(config: pytest.Config, run: DflashRun | None) -> None:
    """Session over: clean up now and put the previous SIGTERM / SIGHUP / SIGINT handlers back."""
    if run is not None:
        run.cleanup()
        atexit.unregister(run.cleanup)
    if interrupts.in_main_thread():
        for sig, handler in config.stash.get(PREVIOUS_SIGNALS_KEY, {}).items():
            if handler is not None:
                signal.signal(sig, handler)
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

