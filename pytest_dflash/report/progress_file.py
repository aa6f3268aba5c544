"""Under xdist, the progress file: a worker appends its lines to `<state_root()>/progress/<run id>.jsonl`, the
controller tails it and shows them (report/progress.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pytest_dflash.report.progress_lines import Line
from pytest_dflash.report.progress_terminal import Terminal

MAX_FILE_BYTES = 4 * 1024 * 1024
TAIL_EVERY_S = 0.25


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
