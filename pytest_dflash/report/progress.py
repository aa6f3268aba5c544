"""Progress lines (``[dflash] …``) on the terminal a person watches: with ``-n N``, without it, and with
``-q``.

What is said: every progress callable of the run (``DflashRun.progress``) takes a ``str``. Two ``str``
subclasses carry the kind: a :class:`~pytest_dflash.services.events.Heartbeat` repeats a state ("waiting 40s
in sampled phase: …", a perf run's "so far" line); a :class:`~pytest_dflash.services.events.ServiceEvent` says
a service was started / became ready / failed and moves the fleet counts (hosts ready / failed / pending).
Every other line is an event. Being ``str``, they pass through every ``Callable[[str], None]`` unchanged.

How it is shown (:class:`Terminal`): heartbeats at most one per service (the text before the first ``": "``)
per :data:`HEARTBEAT_EVERY_S`; with ``-q`` none at all, only events and the fleet counts when they change.
Without ``-n`` and with a terminal on stdout, heartbeats rewrite one live status line (the terminal reporter's
``rewrite``); otherwise every line is a plain line (as logs and CI want).

Under xdist (:class:`ProgressChannel` in a worker): a worker's stdout never reaches the controller, and
xdist has no channel for a plugin's own messages: its controller takes only the events it knows
(``WorkerController.process_from_remote`` raises ``ValueError("unknown event")`` for any other name, xdist
3.x) and ``workeroutput`` arrives only when the worker is done. So each worker appends JSON lines to one file
per run, ``<state_root()>/progress/<run id>.jsonl`` (the run id the controller hands its workers; one
``os.write`` per ``O_APPEND`` line of at most ~1.2 KB, so lines of several workers never interleave), and a
controller thread (:class:`_Tail`) tails it every 0.25 s and prints through the terminal reporter. The file is
bounded (:data:`MAX_FILE_BYTES`: heartbeats are dropped past it, events past twice it), the thread is stopped
and the file removed at session end; files that killed runs left behind are removed after a day.

Capture: a line said on the main thread is written with the capture manager's global and fixture capture
disabled (as before); one said on another thread (a peer's readiness wait in the background) is never written
into a running test's capture: in a worker it only goes to the file, in a single process it is queued and
written by the main thread at its next progress line or test report. The controller's tail thread writes to
a terminal no test captures (xdist's controller runs no tests); a lock serialises its lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.paths import state_root
from pytest_dflash.scrub.bounds import LINE_BYTES, scrub
from pytest_dflash.scrub.terminal import terminal_safe
from pytest_dflash.services.events import Heartbeat, ServiceEvent

__all__ = ["HEARTBEAT_EVERY_S", "MAX_FILE_BYTES", "Line", "ProgressChannel", "Terminal", "classify"]

HEARTBEAT_EVERY_S = 9.0  # one heartbeat per service per ~10 s at most (readiness says one every 10 s)
MAX_FILE_BYTES = 4 * 1024 * 1024
TAIL_EVERY_S = 0.25
STALE_AFTER_S = 86400.0
PREFIX = "[dflash] "


@dataclass(frozen=True)
class Line:
    """One progress line as it travels: its kind, its text (already scrubbed) and the fleet state it
    reports."""

    text: str
    heartbeat: bool = False
    fleet: tuple[str, str, str] | None = None  # (host, service, "started" | "ready" | "failed")

    def to_json(self) -> bytes:
        data: dict[str, Any] = {"kind": "heartbeat" if self.heartbeat else "event", "text": self.text}
        if self.fleet is not None:
            data["fleet"] = list(self.fleet)
        return (json.dumps(data, ensure_ascii=True) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Line | None:
        try:
            data = json.loads(raw)
            fleet = data.get("fleet")
            return cls(text=str(data["text"]), heartbeat=data.get("kind") == "heartbeat",
                       fleet=(str(fleet[0]), str(fleet[1]), str(fleet[2])) if fleet else None)
        except (ValueError, KeyError, TypeError, IndexError):
            return None


def classify(message: str) -> Line:
    fleet = (message.host, message.service, message.state) if isinstance(message, ServiceEvent) else None
    return Line(text=scrub(str(message), LINE_BYTES, "progress line"),
                heartbeat=isinstance(message, Heartbeat), fleet=fleet)


class _Fleet:
    """Hosts ready / failed / pending, from the services' started / ready / failed events."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.hosts = list(hosts)
        self.states: dict[str, dict[str, str]] = {}
        self.last: tuple[int, int, int] | None = None

    def update(self, host: str, service: str, state: str) -> str | None:
        """The fleet line when a service became ready or failed and the counts changed, else None."""
        if host not in self.hosts:
            self.hosts.append(host)
        self.states.setdefault(host, {})[service] = state
        failed = sum(1 for h in self.hosts if "failed" in self.states.get(h, {}).values())
        ready = sum(1 for h in self.hosts if self.states.get(h) and
                    all(s == "ready" for s in self.states[h].values()))
        counts = (ready, failed, len(self.hosts) - ready - failed)
        if state == "started" or counts == self.last:
            return None
        self.last = counts
        return f"fleet: {ready} of {len(self.hosts)} host(s) ready, {failed} failed, {counts[2]} pending"


class Terminal:
    """Writes progress lines through the terminal reporter: rate-limited heartbeats, -q, the live line."""

    def __init__(self, config: pytest.Config, hosts: Sequence[str], *, live: bool) -> None:
        self.config = config
        self.quiet = config.get_verbosity() < 0
        self.fleet = _Fleet(hosts)
        self._lock = threading.Lock()
        self._last_beat: dict[str, float] = {}
        self._live_ok = live
        self._live_shown = False

    @property
    def reporter(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def live(self) -> bool:
        reporter = self.reporter
        return self._live_ok and reporter is not None and bool(reporter.isatty())

    def show(self, line: Line) -> None:
        reporter = self.reporter
        if reporter is None:
            return
        line = replace(line, text=terminal_safe(line.text))  # also a line read back from a worker's file
        with self._lock:
            if line.heartbeat:
                if self.quiet:
                    return
                key = line.text.split(": ", 1)[0]
                now = time.monotonic()
                if now - self._last_beat.get(key, -HEARTBEAT_EVERY_S) < HEARTBEAT_EVERY_S:
                    return
                self._last_beat[key] = now
                if self.live():
                    _newline(reporter)
                    reporter.rewrite(PREFIX + line.text, erase=True)
                    reporter.flush()
                    self._live_shown = True
                    return
            self._end_live(reporter)
            _newline(reporter)
            reporter.write_line(PREFIX + line.text)
            if line.fleet is not None:
                said = self.fleet.update(*line.fleet)
                if said is not None:
                    reporter.write_line(PREFIX + said)

    def end_live(self) -> None:
        reporter = self.reporter
        if reporter is not None:
            with self._lock:
                self._end_live(reporter)

    def _end_live(self, reporter: Any) -> None:
        if self._live_shown:
            reporter.rewrite("", erase=True)
            reporter.write("\r")
            self._live_shown = False


def _newline(reporter: Any) -> None:
    """Start on a fresh line: also after xdist's progress ("s   [100%]"), which ensure_newline does not know
    of."""
    reporter.ensure_newline()
    if getattr(reporter._tw, "width_of_current_line", 0):
        reporter.write("\n")


class _FileWriter:
    """A worker's end of the channel: one JSON line per ``os.write`` to an ``O_APPEND`` file (any thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._full = False
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError:
            self._fd = None  # e.g. a worker on another machine (--tx ssh=…): its progress is not seen

    def write(self, line: Line) -> None:
        with self._lock:
            if self._fd is None:
                return
            try:
                size = os.fstat(self._fd).st_size
                if size > (MAX_FILE_BYTES if line.heartbeat else 2 * MAX_FILE_BYTES):
                    if not self._full and not line.heartbeat:
                        self._full = True
                        os.write(self._fd,
                                 Line(f"progress file full ({size:,} bytes): later lines dropped").to_json())
                    return
                os.write(self._fd, line.to_json())
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class _Tail(threading.Thread):
    """The controller's end: reads the lines workers appended and shows them."""

    def __init__(self, path: Path, terminal: Terminal) -> None:
        super().__init__(name="dflash-progress-tail", daemon=True)
        self.path = path
        self.terminal = terminal
        self._stop_event = threading.Event()
        self._offset = 0
        self._partial = b""

    def run(self) -> None:
        while not self._stop_event.wait(TAIL_EVERY_S):
            self.read()

    def read(self) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read(MAX_FILE_BYTES)
        except OSError:
            return
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            line = Line.from_json(raw)
            if line is not None:
                self.terminal.show(line)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)
        self.read()  # what the workers said last


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

    def __call__(self, message: str) -> None:
        line = classify(message)
        if self._writer is not None:
            self._writer.write(line)
            return
        if threading.current_thread() is not threading.main_thread():
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
        if capture is None:
            for line in lines:
                self.terminal.show(line)
            return
        with capture.global_and_fixture_disabled():
            for line in lines:
                self.terminal.show(line)

    def start(self) -> None:
        """The controller of an xdist run: create the run's file and tail it."""
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
        ended."""
        if self._tail is not None:
            self._tail.stop()
            self._tail = None
            with contextlib.suppress(OSError):
                self.path.unlink()
        if threading.current_thread() is threading.main_thread():
            self._show(self._drained())
        self.terminal.end_live()

    def close(self) -> None:
        self.stop()
        if self._writer is not None:
            self._writer.close()

    # ---- hooks (plugin.py registers the channel) ---------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self._queue:
            self._show(self._drained())

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.stop()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.close()  # a worker's run.cleanup() (after sessionfinish) still reaches the file
