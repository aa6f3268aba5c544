"""Ctrl-C, SIGTERM and SIGHUP are never lost: a latch behind the KeyboardInterrupt they raise.

Python raises KeyboardInterrupt wherever the main thread happens to be when the signal is handled. If that is
inside a finalizer (a `__del__`, a weakref callback, a generator closed by the garbage collector), the
exception is "ignored" — printed as unraisable and dropped — and the run goes on as if nothing happened: a
service it was waiting for then runs out of budget, tests fail, and the run exits 1 instead of 2
(interrupted), its verdict saying fail rather than interrupted. So the handler records the signal before
raising, the plugin's long waits (`raise_if_lost`) raise it again while pytest has not seen it, and the
verdict reads the latch (`received`).

While the run stops what it started (`deferred()`), a signal is latched and not raised: a KeyboardInterrupt in
the middle of teardown would leave services running and the verdicts unwritten. Teardown is bounded on its
own.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_received: str | None = None  # the first signal's name, for this process
_in_teardown = False  # it arrived inside deferred()
_delivered = False  # pytest caught its KeyboardInterrupt (pytest_keyboard_interrupt)
_deferring = False


def on_signal(signum: int, frame: FrameType | None) -> None:
    """SIGINT / SIGTERM handler: latch, then raise as Python's own SIGINT handler does (not while
    deferred)."""
    global _received, _in_teardown
    name = signal.Signals(signum).name
    if _received is None:
        _received, _in_teardown = name, _deferring
    if _deferring:
        return
    raise KeyboardInterrupt(name)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Signals that arrive inside are latched, not raised (teardown; in the main thread only)."""
    global _deferring
    if not in_main_thread() or _deferring:
        yield
        return
    _deferring = True
    try:
        yield
    finally:
        _deferring = False


def install_sigint() -> object | None:
    """Latch SIGINT too, unless someone else already handles it; returns the handler to put back (None:
    none)."""
    if not in_main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return None  # a handler of the user's, or SIGINT ignored (as in a background job): leave it
    signal.signal(signal.SIGINT, on_signal)
    return previous


def in_main_thread() -> bool:
    """Signal handlers live in the main thread only (signal.signal raises elsewhere), and so does the
    latch."""
    return threading.current_thread() is threading.main_thread()


def received() -> str | None:
    """The signal this process received (SIGINT / SIGTERM), or None."""
    return _received


def in_teardown() -> bool:
    """The signal arrived while the run was stopping what it started (the tests had finished or stopped)."""
    return _received is not None and _in_teardown


def lost() -> bool:
    """A signal was received and its KeyboardInterrupt has not reached pytest (yet, or ever)."""
    return _received is not None and not _delivered


def mark_delivered() -> None:
    global _delivered
    _delivered = True


def raise_if_lost() -> None:
    """Called by the plugin's waits on every turn: re-raise an interrupt that a finalizer swallowed."""
    if lost() and not _in_teardown and in_main_thread():
        raise KeyboardInterrupt(f"{_received} (raised again: the first one was lost in a finalizer)")


def reset() -> None:
    """Forget the latch (a new session in the same process: pytester's in-process runs)."""
    global _received, _delivered, _in_teardown
    _received, _delivered, _in_teardown = None, False, False


__all__ = ["deferred", "in_main_thread", "in_teardown", "install_sigint", "lost", "mark_delivered",
           "on_signal", "raise_if_lost", "received", "reset"]
