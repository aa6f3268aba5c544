"""Progress lines (``[dflash] …``) on the terminal a person watches: with ``-n N``, without it, and with
``-q``.

What is said: every progress callable of the run (``DflashRun.progress``) takes a ``str``. Two ``str``
subclasses carry the kind: a :class:`~pytest_dflash.services.events.Heartbeat` repeats a state ("waiting 40s
in sampled phase: …", a perf run's "so far" line); a :class:`~pytest_dflash.services.events.ServiceEvent` says
a service was started / became ready / failed and moves the fleet counts (hosts ready / failed / pending).
Every other line is an event. Being ``str``, they pass through every ``Callable[[str], None]`` unchanged.

How it is shown (:class:`Terminal`): heartbeats at most one per service (the text before the first ``": "``,
"host/service") per :data:`HEARTBEAT_EVERY_S`; with ``-q`` none at all, only events and the fleet counts when
they change. Without ``-n`` or ``-s`` and with a terminal on stdout, heartbeats draw one live line, rewritten
in place (``\r``, the line, clear to its end), naming every service still waiting and what it said last;
otherwise every line is a plain line (as logs and CI want).

Every line reaches the terminal, or the pipe a CI log or a parent process reads, when it is said: whatever the
environment (no PYTHONUNBUFFERED needed) and whichever thread says it. A single process writes straight to a
copy of stdout's descriptor taken in pytest_configure (:class:`_Direct`: ``os.write``, unbuffered, and not the
descriptor a running test's capture redirects), so a service waited for in the background (a peer started
with the first, a fleet pre-flight) is heard while the main thread waits in another test's setup or runs a
test, and never lands in that test's captured output; the terminal reporter's partial line and the live line
are kept apart (:meth:`Terminal.hold` / :meth:`Terminal.release` around its per-test hooks).

Under xdist (:class:`ProgressChannel` in a worker): a worker's stdout never reaches the controller, and
xdist has no channel for a plugin's own messages: its controller takes only the events it knows
(``WorkerController.process_from_remote`` raises ``ValueError("unknown event")`` for any other name, xdist
3.x) and ``workeroutput`` arrives only when the worker is done. So each worker appends JSON lines to one file
per run, ``<state_root()>/progress/<run id>.jsonl`` (the run id the controller hands its workers; one
``os.write`` per ``O_APPEND`` line of at most ~1.2 KB, so lines of several workers never interleave), and a
controller thread (:class:`_Tail`) tails it every 0.25 s and prints through the terminal reporter. The file is
bounded (:data:`MAX_FILE_BYTES`: heartbeats are dropped past it, events past twice it), the thread is stopped
and the file removed at session end; files that killed runs left behind are removed after a day.

A reader that goes away (`pytest … | head -1` past its line, a CI log reader killed: EPIPE) ends the progress
lines for good, the live line included (:meth:`Terminal._guarded`, :attr:`_Direct.gone`): no write of a
progress line raises, into a test, a hook or the controller's tail thread; pytest's own next write then ends
the run as it ends any run whose output pipe closed (status 1, nothing on stderr).

Where stdout has no descriptor (an in-process pytester run) a line said on the main thread is written through
the terminal reporter with the capture manager's global and fixture capture disabled, and one said on another
thread is queued for the main thread's next progress line or test report. The controller's tail thread writes
through the reporter (xdist's controller runs no tests); every such line is flushed at once, and a lock
serialises them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.paths import state_root
from pytest_dflash.report.progress_file import MAX_FILE_BYTES, _FileWriter, _Tail
from pytest_dflash.report.progress_lines import Line, classify
from pytest_dflash.report.progress_terminal import HEARTBEAT_EVERY_S, Terminal, _Direct

__all__ = ["HEARTBEAT_EVERY_S", "MAX_FILE_BYTES", "Line", "ProgressChannel", "Terminal", "_Direct",
           "classify"]

STALE_AFTER_S = 86400.0  # a progress file a killed run left behind is removed after a day


class ProgressChannel:
    """``DflashRun.progress`` of one pytest process, and (registered as a plugin) its session-end hooks."""

    def __init__(self, config: pytest.Config, run_id: str, hosts: Sequence[str]) -> None:
        workerinput = getattr(config, "workerinput", None)
        self.controller = workerinput is None
        self.xdist = self.controller and config.pluginmanager.hasplugin("xdist") and (
            getattr(config.option, "dist", "no") != "no")
        self.path = state_root() / "progress" / f"{run_id}.jsonl"
        self.terminal = Terminal(config, hosts, live=self.controller and not self.xdist)
        self.config = config
        self._writer: _FileWriter | None = None
        if workerinput is not None and workerinput.get("dflash_progress"):
            self._writer = _FileWriter(Path(workerinput["dflash_progress"]))
        self._queue: deque[Line] = deque(maxlen=200)
        self._tail: _Tail | None = None
        self._stopped = False

    def __call__(self, message: str) -> None:
        line = classify(message)
        if self._writer is not None:
            self._writer.write(line)
            return
        main = threading.current_thread() is threading.main_thread()
        if not self._stopped and self.terminal.writes_directly():
            self.terminal.show(line)  # any thread, at once, never into a test's capture
            return
        if not main:
            self._queue.append(line)  # written by the main thread, never into a running test's capture
            return
        self._show([*self._drained(), line])

    def _drained(self) -> list[Line]:
        lines: list[Line] = []
        while self._queue:
            lines.append(self._queue.popleft())
        return lines

    def _show(self, lines: list[Line]) -> None:
        if not lines:
            return
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if capture is None or self.terminal.writes_directly():
            for line in lines:
                self.terminal.show(line)
            return
        with capture.global_and_fixture_disabled():
            for line in lines:
                self.terminal.show(line)

    def start(self) -> None:
        """In pytest_configure, where no test captures stdout yet: a single process takes its copy of stdout's
        descriptor to write to; the controller of an xdist run creates the run's file and tails it."""
        if self.controller and not self.xdist:
            self.terminal.write_to(_Direct.open())
        if not self.xdist or self._tail is not None:
            return
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for old in folder.glob("*.jsonl"):
            try:
                if time.time() - old.stat().st_mtime > STALE_AFTER_S:
                    old.unlink()
            except OSError:
                pass
        self.path.touch(mode=0o600)
        self._tail = _Tail(self.path, self.terminal)
        self._tail.start()

    def workerinput(self) -> dict[str, str]:
        """What the controller hands each worker (pytest_configure_node)."""
        return {"dflash_progress": str(self.path)} if self._tail is not None else {}

    def stop(self) -> None:
        """Session end: the tail's last read, the file removed, what is queued written, the live line
        ended. Later lines of background threads are queued (the reporter writes its summary now)."""
        self._stopped = True
        if self._tail is not None:
            self._tail.stop()
            self._tail = None
            with contextlib.suppress(OSError):
                self.path.unlink()
        self.terminal.end_live()
        if threading.current_thread() is threading.main_thread():
            self._show(self._drained())

    def close(self) -> None:
        self.stop()
        self.terminal.close()
        if self._writer is not None:
            self._writer.close()

    # ---- hooks (plugin.py registers the channel) ---------------------------------------------------

    # The terminal reporter writes a test's progress in these: the live line steps aside meanwhile.
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> Generator[None]:
        self.terminal.hold()
        try:
            return (yield)
        finally:
            self.terminal.release()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> Generator[None]:
        self.terminal.hold()
        try:
            return (yield)
        finally:
            self.terminal.release()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Generator[None]:
        self.terminal.hold()
        try:
            return (yield)
        finally:
            self.terminal.release()
            if self._queue:
                self._show(self._drained())

    # a debugger's prompt is not drawn over either
    def pytest_enter_pdb(self, config: pytest.Config, pdb: Any) -> None:
        self.terminal.hold()

    def pytest_leave_pdb(self, config: pytest.Config, pdb: Any) -> None:
        self.terminal.release()

    # innermost: done before the terminal reporter writes the last "[100%]" after the loop
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        try:
            return (yield)
        finally:
            # the reporter writes its last progress and the summary now: no live line any more, and lines of
            # other threads wait for the main thread (stop, close)
            self._stopped = True
            self.terminal.end_live()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.stop()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.close()  # a worker's run.cleanup() (after sessionfinish) still reaches the file
