"""Progress you can see, as a person sees it (report/progress.py, services/readiness.py): real runs of the smoke
suite against real refservers, read through a real pseudo-terminal and through a pipe, with and without ``-n 1``,
each child given an environment built from scratch (a fresh machine's ``env -i HOME PATH``: no
PYTHONUNBUFFERED). The profile's plain service is ready at once; its DFLASH service spends ~24 s in CUDA-graph
capture and a cold sampling JIT, waited for in the background while the main thread waits in the next test's
setup. Every run must show the "started" line at once, the 10 s and the 20 s heartbeats at their time (not
bunched with "ready" at the end), each naming host/service and the phase; ``-q`` no heartbeat; a terminal without
``-n`` the live line, rewritten in place. The five runs go side by side: one ~25 s wait, not five."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.terminal import render

pytestmark = pytest.mark.slow

SUITES = Path(__file__).parents[2] / "suites"
SLOW = ["--inject", "slow-graphs=14,cold-jit=10"]  # ready after ~24 s: heartbeats at 10 s and 20 s
HEARTBEAT = rb"\[dflash\] (\S+): waiting (\d+\.\d)s in (\w+) phase"
PHASES = {b"http", b"warmup", b"greedy", b"sampled"}


def profile(directory: Path, host: str) -> Path:
    """A local host with a plain refserver (ready at once) and a slow DFLASH one."""
    lines = ["[host]", 'connection = "local://"', f'python = "{sys.executable}"', 'provision = "always"', ""]
    for service, algorithm, extra in (("plain", "NONE", []), ("dflash", "DFLASH", SLOW)):
        command = ["{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
                   "--speculative-algorithm", algorithm, *extra]
        lines += [f"[services.{service}]", 'kind = "process"', f'algorithm = "{algorithm}"',
                  "command = [" + ", ".join(f'"{part}"' for part in command) + "]", 'ready_timeout = "90s"', ""]
    path = directory / f"{host}.toml"
    path.write_text("\n".join(lines))
    return path


def bare_env(state: Path) -> dict[str, str]:
    """What a fresh machine's shell has (HOME, PATH), this run's own state folder and a terminal width: nothing
    inherited from the harness (PYTHONUNBUFFERED above all)."""
    return {"HOME": os.environ.get("HOME", "/root"), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "DFLASH_STATE_DIR": str(state), "COLUMNS": "160"}


@dataclass
class Watched:
    """One run and what it wrote, each chunk with the moment it arrived."""

    host: str
    terminal: bool
    proc: subprocess.Popen[bytes]
    fd: int
    chunks: list[tuple[float, bytes]] = field(default_factory=list)

    def read_all(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the terminal's other end closed
                break
            if not chunk:
                break
            self.chunks.append((time.monotonic(), chunk))
        os.close(self.fd)

    @property
    def raw(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)

    def arrivals(self, pattern: bytes) -> list[tuple[float, re.Match[bytes]]]:
        """Every match of `pattern` in the output, with when its last byte arrived."""
        ends, total = [], 0
        for at, chunk in self.chunks:
            total += len(chunk)
            ends.append((total, at))
        found = []
        for match in re.finditer(pattern, self.raw):
            found.append((next(at for end, at in ends if end >= match.end()), match))
        return found

    def first(self, text: str) -> float:
        found = self.arrivals(re.escape(text.encode()))
        assert found, f"{self.host}: {text!r} never came:\n{self.shown()}"
        return found[0][0]

    def shown(self) -> str:
        return self.raw.decode(errors="replace")[-4000:]


def start(tmp_path: Path, host: str, *args: str, terminal: bool) -> Watched:
    folder = tmp_path / host
    folder.mkdir()
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(SUITES / "smoke"), "--host",
               str(profile(folder, host)), "-k", "test_service_ready", f"--dflash-report={folder / 'reports'}",
               *args]
    if terminal:
        main, secondary = pty.openpty()
        proc = subprocess.Popen(command, cwd=folder, env=bare_env(folder / "state"), stdin=subprocess.DEVNULL,
                                stdout=secondary, stderr=secondary, start_new_session=True)
        os.close(secondary)
        return Watched(host, True, proc, main)
    proc = subprocess.Popen(command, cwd=folder, env=bare_env(folder / "state"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    return Watched(host, False, proc, os.dup(proc.stdout.fileno()))


def check_heartbeats(run: Watched) -> None:
    """'started' at once; the 10 s and 20 s heartbeats at their time, naming host/service and the phase; 'ready'
    after them."""
    service = f"{run.host}/dflash"
    started = run.first(f"[dflash] {service}: started (")
    ready = run.first(f"[dflash] {service}: ready after")
    # a terminal's live line is repainted after other output: a repaint repeats its beat, it is not a new one
    beats: list[tuple[float, re.Match[bytes]]] = []
    for at, match in run.arrivals(HEARTBEAT):
        if match.group(1) == service.encode() and match.group(2) not in {m.group(2) for _, m in beats}:
            beats.append((at, match))
    assert len(beats) >= 2, f"{run.host}: fewer than 2 heartbeats naming {service}:\n{run.shown()}"
    (first_at, first), (second_at, second) = beats[:2]
    assert 9.5 <= float(first.group(2)) < 14 and 19.5 <= float(second.group(2)) < 26, run.shown()
    assert first.group(3) in PHASES and second.group(3) in PHASES, run.shown()
    assert ready - started > 18, f"{run.host}: 'started' came only {ready - started:.1f}s before 'ready'"
    assert 8 <= first_at - started <= 18, f"{run.host}: the 10 s heartbeat came {first_at - started:.1f}s in"
    assert second_at - first_at >= 7, f"{run.host}: the heartbeats came {second_at - first_at:.1f}s apart"
    assert ready - first_at >= 9, f"{run.host}: 'ready' came {ready - first_at:.1f}s after the 10 s heartbeat"


def test_progress_reaches_a_terminal_and_a_pipe_as_it_happens(tmp_path: Path) -> None:
    runs = [start(tmp_path, "live-tty", terminal=True), start(tmp_path, "live-pipe", terminal=False),
            start(tmp_path, "live-tty-n1", "-n", "1", terminal=True),
            start(tmp_path, "live-pipe-n1", "-n", "1", terminal=False),
            start(tmp_path, "live-quiet", "-q", terminal=True)]
    readers = [threading.Thread(target=run.read_all, daemon=True) for run in runs]
    for reader in readers:
        reader.start()
    try:
        for run, reader in zip(runs, readers, strict=True):
            assert run.proc.wait(timeout=200) == 0, f"{run.host}:\n{run.shown()}"
            reader.join(timeout=10)
    finally:
        for run in runs:
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, 9)
    tty, pipe, tty_n1, pipe_n1, quiet = runs
    for run in (tty, pipe, tty_n1, pipe_n1):
        check_heartbeats(run)
    # a terminal without -n: the heartbeats rewrite one live line (never a line of their own)
    live = rb"\r\[dflash\] live-tty/dflash: waiting \d+\.\ds in \w+ phase[^\r\n]*\x1b\[K"
    assert len(re.findall(live, tty.raw)) >= 2, tty.shown()
    assert not re.search(rb"waiting \d+\.\ds[^\r\n\x1b]*\r\n", tty.raw), tty.shown()
    screen = render(tty.raw, width=160)  # once done: the state changes, the reporter's lines, no live line left
    assert "[dflash] live-tty/dflash: started" in "\n".join(screen) and not any("waiting" in row for row in screen)
    assert any(re.fullmatch(r"\.+ +\[100%\]", row) for row in screen), screen
    # a pipe, and -n: one plain line per heartbeat
    assert re.search(rb"\n\[dflash\] live-pipe/dflash: waiting 1\d\.\ds in \w+ phase[^\r\n]*\n", pipe.raw)
    # -q: the state changes, no heartbeat
    quiet.first("[dflash] live-quiet/dflash: started (")
    quiet.first("[dflash] live-quiet/dflash: ready after")
    assert b"waiting" not in quiet.raw, quiet.shown()
