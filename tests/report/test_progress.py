"""report/progress.py in a real pytest session on a real pseudo-terminal: the live line, the heartbeat rate limit,
-q, and a background thread's line kept out of the running test's capture."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

TEST = '''
import threading

from pytest_dflash.report.progress import ProgressChannel
from pytest_dflash.services.events import Heartbeat, ServiceEvent


def test_progress(pytestconfig):
    say = ProgressChannel(pytestconfig, "unit", hosts=["h1", "h2"])
    say(ServiceEvent("h1/svc: started", host="h1", service="svc", state="started"))
    say(Heartbeat("svc: waiting 10.0s in greedy phase"))
    say(Heartbeat("svc: waiting 10.5s in greedy phase"))  # same service within ~10 s: not shown
    say(Heartbeat("other: waiting 10.0s in http phase"))
    say(ServiceEvent("h1/svc: ready after 12.0s", host="h1", service="svc", state="ready"))
    thread = threading.Thread(target=say, args=("h2/svc: said from a thread",))
    thread.start()
    thread.join()
    print("CAPTURED-MARKER")
    say.stop()
'''


def run_on_a_tty(tmp_path: Path, *args: str) -> str:
    (tmp_path / "test_unit_progress.py").write_text(TEST)
    main, secondary = pty.openpty()
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rP",
                             "test_unit_progress.py", *args], cwd=tmp_path, stdout=secondary,
                            stderr=secondary, stdin=subprocess.DEVNULL, env=env)
    os.close(secondary)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_live_line_rate_limit_fleet_and_thread_lines_on_a_terminal(tmp_path: Path) -> None:
    out = run_on_a_tty(tmp_path)
    assert "\r[dflash] svc: waiting 10.0s in greedy phase" in out, out  # rewritten in place: the live line
    assert "10.5s" not in out, out
    assert "\r[dflash] other: waiting 10.0s in http phase" in out, out
    assert "[dflash] h1/svc: started\r\n" in out, out
    assert "[dflash] h1/svc: ready after 12.0s\r\n" in out, out
    assert "[dflash] fleet: 1 of 2 host(s) ready, 0 failed, 1 pending" in out, out
    assert out.count("said from a thread") == 1, out
    captured = out.split("Captured stdout call", 1)[1]
    assert "CAPTURED-MARKER" in captured and "said from a thread" not in captured, out


@pytest.mark.parametrize("quiet", ["-q", "-qq"])
def test_quiet_prints_events_only(tmp_path: Path, quiet: str) -> None:
    out = run_on_a_tty(tmp_path, quiet)
    assert "waiting" not in out, out
    assert "[dflash] h1/svc: started" in out and "[dflash] h1/svc: ready after 12.0s" in out, out
    assert "[dflash] fleet: 1 of 2 host(s) ready, 0 failed, 1 pending" in out, out
