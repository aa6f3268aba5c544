"""Progress lines on the terminal (report/progress.py says how they are shown): the live line, heartbeats
at most one per service per :data:`HEARTBEAT_EVERY_S`, -q, the fleet counts, written straight to a copy of
stdout's descriptor from any thread or through the terminal reporter."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from pytest_dflash.report.progress_lines import Line
from pytest_dflash.scrub.terminal import terminal_safe

HEARTBEAT_EVERY_S = 9.0  # one heartbeat per service per ~10 s at most (readiness says one every 10 s)
LIVE_STALE_S = 25.0  # a service on the live line that said nothing for this long is no longer shown
PREFIX = "[dflash] "


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
        if len(self.hosts) < 2:  # one host: its service's own ready / failed line says it all
            return None
        return f"fleet: {ready} of {len(self.hosts)} hosts ready, {failed} failed, {counts[2]} pending"


class _Direct:
    """The terminal's own file descriptor: a copy of stdout's, taken before any test captured it
    (pytest_configure runs with the global capture suspended). Written with ``os.write``: unbuffered, so a
    line reaches a pipe (a CI log, a parent process) when it is said, with or without PYTHONUNBUFFERED; and,
    being a copy, it is not the descriptor a running test's capture redirects, so a background thread's line
    reaches the terminal at once and never lands in a test's captured output."""

    def __init__(self, stdout: Any, fd: int) -> None:
        self.stdout = stdout  # the file object the terminal reporter writes to: checked before use
        self.fd: int | None = fd
        self.encoding = str(getattr(stdout, "encoding", None) or "utf-8")

    @classmethod
    def open(cls) -> _Direct | None:
        """A copy of stdout's descriptor, or None where stdout has none (an in-process pytester run)."""
        stdout = sys.stdout
        try:
            return cls(stdout, os.dup(stdout.fileno()))
        except (AttributeError, OSError, ValueError):
            return None

    def write(self, text: str) -> None:
        """Write `text` whole; never raises. The reader gone (`pytest … | head -1` past its line: EPIPE)
        closes this copy, and nothing is written to it again (:attr:`gone`); any other failed write loses the
        line."""
        data = text.encode(self.encoding, errors="replace")
        while data and self.fd is not None:
            try:
                data = data[os.write(self.fd, data):]
            except OSError as exc:
                if _reader_gone(exc):
                    self.close()
                return  # the line is lost, the run goes on

    @property
    def gone(self) -> bool:
        """True once the terminal or pipe is gone (or the copy was closed): nothing more is written."""
        return self.fd is None

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class Terminal:
    """Writes progress lines: rate-limited heartbeats, -q, the live line.

    Where: given a :class:`_Direct` (:meth:`write_to`) whose stdout the terminal reporter writes to (a single
    process), straight to the terminal, from any thread, each write whole and unbuffered. The reporter's own
    output stays intact around it: a line said while the reporter's current line holds text ("test_smoke.py
    .s.") starts on a new line and the reporter is told its line is done; the live line is drawn on the row
    below the reporter's text and erased (the cursor back after that text) before the reporter writes again
    (:meth:`hold` / :meth:`release` around its per-test hooks). Otherwise (the xdist controller's tail, a run
    without a stdout descriptor): through the terminal reporter, flushed after each line."""

    def __init__(self, config: pytest.Config, hosts: Sequence[str], *, live: bool) -> None:
        self.config = config
        self.quiet = config.get_verbosity() < 0
        self.fleet = _Fleet(hosts)
        self._lock = threading.Lock()
        self._last_beat: dict[str, float] = {}
        self._live_ok = live
        self._live_shown = False
        self._direct: _Direct | None = None  # write_to
        self._direct_checked = False
        # the direct writer's state: what each waiting service said last (and when), the live line drawn
        # (below the reporter's partial line?), the lines said while the reporter writes, the session ended
        self._waiting: dict[str, tuple[str, float]] = {}
        self._drawn = False
        self._drawn_below = False
        self._held = False
        self._pending: deque[Line] = deque(maxlen=200)
        self._ended = False
        self._gone = False  # the terminal or pipe went away (EPIPE): no line is written any more (_guarded)

    @property
    def reporter(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def live(self) -> bool:
        """True when heartbeats draw the live line: a terminal, no -n, no -q, and no -s (a test's own output,
        such as the perf layer's progress bar, may then hold the line the live line would rewrite)."""
        reporter = self.reporter
        return (self._live_ok and not self.quiet and reporter is not None and bool(reporter.isatty())
                and getattr(self.config.option, "capture", "fd") != "no")

    def write_to(self, direct: _Direct | None) -> None:
        """Write straight to `direct` from now on (None: through the terminal reporter)."""
        with self._lock:
            if self._direct is not None:
                self._direct.close()
            self._direct, self._direct_checked = direct, False

    def writes_directly(self) -> bool:
        """True when lines go straight to the terminal (from any thread, never into a test's capture)."""
        reporter = self.reporter
        with self._lock:
            return self._direct_writer(reporter) is not None

    def _direct_writer(self, reporter: Any) -> _Direct | None:
        if self._direct is None or reporter is None:
            return None
        if not self._direct_checked:  # the reporter exists from the first line on: check it writes there
            self._direct_checked = True
            if getattr(getattr(reporter, "_tw", None), "_file", None) is not self._direct.stdout:
                self._direct.close()
                self._direct = None
        return self._direct

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        """Around every write (under the lock): a progress line never fails a test or the run. A terminal or
        pipe that went away (the reader of `pytest … | head -1` exited: EPIPE) ends the lines for good, the
        live line included; any other failed write loses that line only."""
        try:
            yield
        except OSError as exc:
            if _reader_gone(exc):
                self._gone = True
        except ValueError as exc:  # the reporter's file object closed under it
            if "closed file" not in str(exc):
                raise
            self._gone = True
        if self._direct is not None and self._direct.gone:
            self._gone = True

    def show(self, line: Line) -> None:
        reporter = self.reporter
        if reporter is None or self._gone:
            return
        line = replace(line, text=terminal_safe(line.text))  # also a line read back from a worker's file
        with self._lock, self._guarded():
            if (line.heartbeat and self.quiet) or self._gone:
                return
            direct = self._direct_writer(reporter)
            if direct is None:
                self._show_through_reporter(reporter, line)
            elif self._held:
                self._pending.append(line)  # the reporter is writing: after it (release)
            else:
                self._show_direct(reporter, direct, [line])

    # ---- straight to the terminal ----------------------------------------------------------------------

    def _show_direct(self, reporter: Any, direct: _Direct, lines: list[Line]) -> None:
        now = time.monotonic()
        live = self.live() and not self._ended
        said: list[str] = []
        for line in lines:
            if line.heartbeat:
                key = _who(line.text)
                self._waiting[key] = (line.text, now)
                if live or now - self._last_beat.get(key, -HEARTBEAT_EVERY_S) < HEARTBEAT_EVERY_S:
                    continue  # on the live line, or said less than ~10 s ago
                self._last_beat[key] = now
                said.append(PREFIX + line.text)
                continue
            for key in [key for key in self._waiting if _about(line.text, key)]:
                del self._waiting[key]  # ready, failed, measured: no longer waiting
            said.append(PREFIX + line.text)
            if line.fleet is not None and (counts := self.fleet.update(*line.fleet)) is not None:
                said.append(PREFIX + counts)
        if not said and not live:
            return
        if threading.current_thread() is threading.main_thread():
            reporter.flush()  # what the reporter wrote goes first (other threads: its hooks flushed it)
        out = self._erase_live(reporter._tw)
        if said:
            if reporter._tw.width_of_current_line:
                out += "\n"
                _forget_current_line(reporter._tw)
            out += "\n".join(said) + "\n"
        if live:
            out += self._draw_live(reporter._tw, now)
        if out:
            direct.write(out)

    def _erase_live(self, tw: Any) -> str:
        """What erases the live line and puts the cursor back where the reporter left it."""
        if not self._drawn:
            return ""
        self._drawn = False
        if not self._drawn_below:
            return "\r\x1b[K"
        column = tw.width_of_current_line % max(tw.fullwidth, 1) + 1
        return f"\r\x1b[K\x1b[A\x1b[{column}G"  # up to the reporter's partial line, after its last character

    def _draw_live(self, tw: Any, now: float) -> str:
        """What draws the live line (every waiting service, one row, cut to the width), or '' when none
        waits."""
        for key in [key for key, (_, at) in self._waiting.items() if now - at > LIVE_STALE_S]:
            del self._waiting[key]  # a wait that ended without a line (its thread gone, a test done)
        if not self._waiting:
            return ""
        texts = [text for text, _ in self._waiting.values()]
        shown = texts[0] if len(texts) == 1 else f"{len(texts)} waiting: " + " | ".join(
            ": ".join(text.split(": ", 2)[:2]) for text in texts)
        width = max(tw.fullwidth, 1)
        shown = (PREFIX + shown)[:max(width - 1, 1)]  # one row: a wrapped line could not be rewritten
        current = tw.width_of_current_line
        if current and current % width == 0:
            # the reporter's line ends at the margin (the cursor waits to wrap): no row to come back to
            out = "\n"
            _forget_current_line(tw)
            current = 0
        else:
            out = "\n" if current else ""
        self._drawn, self._drawn_below = True, bool(current)
        return f"{out}\r{shown}\x1b[K"

    def hold(self) -> None:
        """The reporter is about to write (the main thread, in a per-test hook): the live line is erased and
        lines said meanwhile wait for :meth:`release`."""
        reporter = self.reporter
        with self._lock, self._guarded():
            direct = self._direct_writer(reporter)
            if direct is None:
                return
            self._held = True
            if self._drawn and not self._gone:
                direct.write(self._erase_live(reporter._tw))

    def release(self) -> None:
        """The reporter wrote: its output flushed, the lines said meanwhile written, the live line drawn
        again."""
        reporter = self.reporter
        with self._lock, self._guarded():
            direct = self._direct_writer(reporter)
            if direct is None or not self._held:
                return
            self._held = False
            pending = list(self._pending)
            self._pending.clear()
            if not self._gone:
                self._show_direct(reporter, direct, pending)

    # ---- through the terminal reporter ------------------------------------------------------------------

    def _show_through_reporter(self, reporter: Any, line: Line) -> None:
        if line.heartbeat:
            key = _who(line.text)
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
        reporter.flush()  # a pipe's buffer would hold it until the run ends

    def end_live(self) -> None:
        """Session end: the live line erased, and not drawn again."""
        reporter = self.reporter
        with self._lock, self._guarded():
            self._ended = True
            if self._gone:
                return
            direct = self._direct_writer(reporter)
            if direct is not None and self._drawn:
                direct.write(self._erase_live(reporter._tw))
            elif direct is None and reporter is not None:
                self._end_live(reporter)

    def close(self) -> None:
        with self._lock:
            if self._direct is not None:
                self._direct.close()
                self._direct = None

    def _end_live(self, reporter: Any) -> None:
        if self._live_shown:
            reporter.rewrite("", erase=True)
            reporter.write("\r")
            reporter.flush()
            self._live_shown = False


def _reader_gone(exc: OSError) -> bool:
    """Did a write fail because nothing reads the terminal or pipe any more (EPIPE: a closed pipe; EIO: a
    terminal that went away; EBADF: the descriptor closed)?"""
    return isinstance(exc, BrokenPipeError) or exc.errno in (errno.EPIPE, errno.EIO, errno.EBADF)


def _who(text: str) -> str:
    """The service (or other subject) a line is about: its text before the first ': '."""
    return text.split(": ", 1)[0]


def _about(text: str, who: str) -> bool:
    """True when a line is about `who` ("h/svc: ready after 3.0s", "h/svc (DFLASH): 480 tok/s")."""
    return text.startswith((f"{who}: ", f"{who} "))


def _forget_current_line(tw: Any) -> None:
    """The reporter's current line was ended behind its back (a line written straight to the terminal): its
    next output starts a fresh line, and its right-aligned "[ 50%]" must count from there."""
    if hasattr(tw, "_current_line"):
        tw._current_line = ""


def _newline(reporter: Any) -> None:
    """Start on a fresh line: also after xdist's progress ("s   [100%]"), which ensure_newline does not know
    of."""
    reporter.ensure_newline()
    if getattr(reporter._tw, "width_of_current_line", 0):
        reporter.write("\n")
