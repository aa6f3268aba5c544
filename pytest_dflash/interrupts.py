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

A KeyboardInterrupt raised by a handler can also carry a traceback entry whose line is None: CPython 3.11
handles signals between any two instructions, including the artificial ones of exception cleanup that map to
no line. pytest's traceback printer then fails (`tb_lineno - 1`: a TypeError inside
pytest_keyboard_interrupt), which escapes pytest and turns an interrupted run (exit 2) into a crash (exit 1).
`mend_traceback` gives each such entry the line its instruction follows.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import CodeType, FrameType, TracebackType

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


def mend_traceback(exc: BaseException) -> TracebackType | None:
    """Give every entry of `exc`'s traceback, and of the exceptions it chains, a line (see the module
    docstring); returns `exc`'s mended traceback, which is also set on `exc`."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        one = todo.pop()
        if one is None or id(one) in seen:
            continue
        seen.add(id(one))
        one.__traceback__ = _with_lines(one.__traceback__)
        todo += [one.__cause__, one.__context__, *getattr(one, "exceptions", ())]
    return exc.__traceback__


def _with_lines(tb: TracebackType | None) -> TracebackType | None:
    nodes: list[TracebackType] = []
    while tb is not None:
        nodes.append(tb)
        tb = tb.tb_next
    mended: TracebackType | None = None
    for node in reversed(nodes):  # rebuilt from the innermost entry: a node's line cannot be set in place
        if node.tb_lineno is None:
            node = TracebackType(mended, node.tb_frame, node.tb_lasti, _line_before(node.tb_frame.f_code,
                                                                                     node.tb_lasti))
        else:
            node.tb_next = mended
        mended = node
    return mended


def _line_before(code: CodeType, offset: int) -> int:
    """The line of the last instruction at or before `offset` that has one (the function's first line if
    none)."""
    line = code.co_firstlineno
    for start, _end, number in code.co_lines():
        if start > offset:
            break
        if number is not None:
            line = number
    return line


def reset() -> None:
    """Forget the latch (a new session in the same process: pytester's in-process runs)."""
    global _received, _delivered, _in_teardown
    _received, _delivered, _in_teardown = None, False, False


__all__ = ["deferred", "in_main_thread", "in_teardown", "install_sigint", "lost", "mark_delivered",
           "mend_traceback", "on_signal", "raise_if_lost", "received", "reset"]
