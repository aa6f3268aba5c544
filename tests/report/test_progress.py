"""report/progress.py in a real pytest session on a real pseudo-terminal and a pipe: the live line, the heartbeat
rate limit, -q, and a background thread's line kept out of the running test's capture. The first three run the
channel made inside a test (stdout captured: written through the terminal reporter); the others make it as the
plugin does, in pytest_configure (written straight to the terminal, from any thread)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest
from support.terminal import render

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
    assert "[dflash] fleet: 1 of 2 hosts ready, 0 failed, 1 pending" in out, out
    assert out.count("said from a thread") == 1, out
    captured = out.split("Captured stdout call", 1)[1]
    assert "CAPTURED-MARKER" in captured and "said from a thread" not in captured, out


@pytest.mark.parametrize("quiet", ["-q", "-qq"])
def test_quiet_prints_events_only(tmp_path: Path, quiet: str) -> None:
    out = run_on_a_tty(tmp_path, quiet)
    assert "waiting" not in out, out
    assert "[dflash] h1/svc: started" in out and "[dflash] h1/svc: ready after 12.0s" in out, out
    assert "[dflash] fleet: 1 of 2 hosts ready, 0 failed, 1 pending" in out, out


# ---- the single-process writer: straight to the terminal, from any thread ----------------------------------

CONFTEST = '''
import pytest

from pytest_dflash.report.progress import ProgressChannel

CHANNEL = []


def pytest_configure(config):
    channel = ProgressChannel(config, "unit", hosts=["h1", "h2"])
    config.pluginmanager.register(channel, "unit-progress")
    channel.start()  # as the plugin does: in pytest_configure, before any test captures stdout
    CHANNEL.append(channel)


@pytest.fixture
def say():
    return CHANNEL[0]
'''

TEST_THREADS = '''
import threading

from pytest_dflash.services.events import Heartbeat, ServiceEvent


def test_waits(say):
    print("CAPTURED-MARKER")
    lines = [ServiceEvent("h1/a: started", host="h1", service="a", state="started"),
             Heartbeat("h1/a: waiting 10.0s in http phase: in CUDA-graph capture"),
             Heartbeat("h2/b: waiting 10.0s in sampled phase: request in flight"),
             Heartbeat("h1/a: waiting 10.5s in http phase: again"),  # within ~10 s of the last: no line
             ServiceEvent("h1/a: ready after 12.0s", host="h1", service="a", state="ready")]
    thread = threading.Thread(target=lambda: [say(line) for line in lines])  # a background readiness wait
    thread.start()
    thread.join()


def test_next():
    pass
'''


def _env(**more: str) -> dict[str, str]:
    """An environment built from scratch (no PYTHONUNBUFFERED), importing the pytest_dflash under test."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": os.environ.get("PATH", ""), "COLUMNS": "120", **more}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def run_threads(tmp_path: Path, *args: str, terminal: bool) -> bytes:
    """A real pytest run whose progress channel is made as the plugin makes it, its output read through a
    pseudo-terminal or a pipe; the environment built from scratch (no PYTHONUNBUFFERED)."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_threads.py").write_text(TEST_THREADS)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rP",
               "test_threads.py", *args]
    env = _env()
    if not terminal:
        done = subprocess.run(command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=60)
        assert done.returncode == 0, done.stdout.decode(errors="replace")
        return done.stdout
    main, secondary = pty.openpty()
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=secondary, stderr=secondary,
                            stdin=subprocess.DEVNULL, env=env)
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
    out = b"".join(chunks)
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")
    return out


def test_a_background_wait_draws_the_live_line_on_a_terminal_and_leaves_the_screen_clean(tmp_path: Path) -> None:
    raw = run_threads(tmp_path, terminal=True)
    out = raw.decode(errors="replace")
    # every waiting service on one line, rewritten in place; a service that became ready leaves it
    assert ("\r[dflash] 2 waiting: h1/a: waiting 10.0s in http phase | h2/b: waiting 10.0s in sampled phase"
            "\x1b[K") in out, out
    assert "\r[dflash] 2 waiting: h1/a: waiting 10.5s in http phase | h2/b" in out, out
    assert "\r[dflash] h2/b: waiting 10.0s in sampled phase: request in flight\x1b[K" in out, out
    screen = render(raw)
    assert "[dflash] h1/a: started" in screen and "[dflash] h1/a: ready after 12.0s" in screen, screen
    assert "[dflash] fleet: 1 of 2 hosts ready, 0 failed, 1 pending" in screen, screen
    assert not any("waiting" in row for row in screen), screen  # the live line is gone once the run ends
    # the reporter's own line is whole: its two results and the progress, right-aligned to the width
    assert any(re.fullmatch(r"\.\. +\[100%\]", row) and len(row) == 119 for row in screen), screen
    captured = out.split("Captured stdout call", 1)[1]
    assert "CAPTURED-MARKER" in captured and "[dflash]" not in captured, out


def test_a_background_wait_writes_rate_limited_heartbeat_lines_to_a_pipe(tmp_path: Path) -> None:
    out = run_threads(tmp_path, terminal=False).decode()
    assert "\n[dflash] h1/a: started\n" in out, out
    assert "\n[dflash] h1/a: waiting 10.0s in http phase: in CUDA-graph capture\n" in out, out
    assert "\n[dflash] h2/b: waiting 10.0s in sampled phase: request in flight\n" in out, out
    assert "10.5s" not in out and "\x1b[K" not in out, out
    assert re.search(r"\n\.\. +\[100%\]\n", out), out
    captured = out.split("Captured stdout call", 1)[1]
    assert "CAPTURED-MARKER" in captured and "[dflash]" not in captured, out


def test_quiet_draws_no_live_line(tmp_path: Path) -> None:
    out = run_threads(tmp_path, "-q", terminal=True).decode(errors="replace")
    assert "waiting" not in out, out
    assert "[dflash] h1/a: started" in out and "[dflash] h1/a: ready after 12.0s" in out, out


TEST_PDB = '''
import threading
import time

from pytest_dflash.services.events import Heartbeat


def test_debugged(say):
    later = lambda: (time.sleep(1.0), say(Heartbeat("h2/b: waiting 10.0s in sampled phase: said in pdb")))
    thread = threading.Thread(target=later)
    thread.start()
    breakpoint()
    thread.join()
'''


def test_the_live_line_waits_while_a_debugger_prompts(tmp_path: Path) -> None:
    """A background wait's heartbeat is not drawn over pdb's prompt: it is drawn once the debugger is left."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_pdb.py").write_text(TEST_PDB)
    env = _env()
    main, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "test_pdb.py"], cwd=tmp_path, stdout=secondary, stderr=secondary, stdin=secondary,
                            env=env)
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + 60
    while b"(Pdb) " not in seen and time.monotonic() < deadline:
        seen += os.read(main, 65536)
    time.sleep(2.5)  # the thread says its heartbeat 1 s after the prompt came
    while select.select([main], [], [], 0.2)[0]:
        seen += os.read(main, 65536)
    at_prompt = seen
    os.write(main, b"c\n")
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the other end closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(timeout=60) == 0, seen.decode(errors="replace")
    assert b"(Pdb) " in at_prompt and b"said in pdb" not in at_prompt, at_prompt.decode(errors="replace")
    assert b"\r[dflash] h2/b: waiting 10.0s in sampled phase: said in pdb\x1b[K" in seen, seen.decode(
        errors="replace")


def test_with_s_the_heartbeats_are_lines_not_a_live_line(tmp_path: Path) -> None:
    """-s: a test's own output (the perf layer's progress bar) may hold the line a live line would rewrite."""
    out = run_threads(tmp_path, "-s", terminal=True).decode(errors="replace")
    assert "\n[dflash] h1/a: waiting 10.0s in http phase: in CUDA-graph capture\r\n" in out, out
    assert "\x1b[K" not in out, out


# ---- a reader that goes away: `pytest ... | head -1` ---------------------------------------------------------

CONFTEST_XDIST = CONFTEST + '''

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput.update(CHANNEL[0].workerinput())  # as the plugin does: the worker's end of the file
'''

TEST_CLOSED = '''
import os
import threading
import time

from pytest_dflash.services.events import Heartbeat, ServiceEvent


def test_says_on_after_the_reader_left(say):
    say("h1/a: the line the reader waits for")
    deadline = time.monotonic() + 30
    while not os.path.exists(os.environ["READER_GONE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(os.environ["READER_GONE"]), "the reader never left"
    for i in range(3):  # from the main thread and from another, events and heartbeats
        say(ServiceEvent(f"h1/a: started {i}", host="h1", service="a", state="started"))
        thread = threading.Thread(target=say, args=(Heartbeat(f"h2/b: waiting {i}.0s in http phase"),))
        thread.start()
        thread.join()
    with open(os.environ["SAID"], "w") as said:  # no line raised into the test
        said.write("said")
    time.sleep(1.0)  # an xdist controller's tail (every 0.25 s) writes them meanwhile, before pytest writes again
'''


@pytest.mark.parametrize("mode", ["single", "xdist"])
def test_a_reader_that_goes_away_ends_the_progress_lines_without_a_traceback(tmp_path: Path, mode: str) -> None:
    """`pytest ... | head -1`: the parent reads up to the first progress line, then closes its end of the pipe;
    the lines said after that (straight to the descriptor in a single process, through the terminal reporter
    from an xdist controller's tail thread) hit EPIPE. They stop quietly: no traceback, no INTERNALERROR, no
    "Exception in thread" on stderr, the exit status Python's for a closed pipe (1), and the run still ends as
    pytest ends it (at its own next write: the session-end hooks after the progress channel's, JUnit's here,
    still run, and no error in its report was raised by pytest_dflash)."""
    (tmp_path / "conftest.py").write_text(CONFTEST_XDIST)
    (tmp_path / "test_closed.py").write_text(TEST_CLOSED)
    gone, said = tmp_path / "reader-gone", tmp_path / "said"
    junit = tmp_path / "junit.xml"
    args = ["-p", "xdist", "-n", "1"] if mode == "xdist" else ["-p", "no:xdist"]
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "test_closed.py",
                             f"--junitxml={junit}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=_env(READER_GONE=str(gone), SAID=str(said),
                                                               DFLASH_STATE_DIR=str(tmp_path / "state")))
    assert proc.stdout is not None and proc.stderr is not None
    read = b""
    while b"[dflash] h1/a: the line the reader waits for" not in read:
        line = proc.stdout.readline()
        if not line:
            break
        read += line
    proc.stdout.close()  # the reader leaves, as `head -1` does after its line
    gone.touch()
    try:
        stderr = proc.stderr.read().decode(errors="replace")
        returncode = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert b"the line the reader waits for" in read, read.decode(errors="replace")
    assert "Traceback" not in stderr and "INTERNALERROR" not in stderr and "Exception in thread" not in stderr, (
        stderr)
    assert said.is_file(), "a progress line said after the reader left raised into the test"
    assert returncode in (0, 1), (returncode, stderr)  # 1: Python's status on EPIPE (pytest's console_main)
    assert junit.is_file(), "the session-end hooks after the progress channel's did not run"
    # pytest's own next write to the closed pipe ends the run (its internal error, in JUnit): never a write of
    # a progress line (no error raised in pytest_dflash's code), and never a test failed by one
    report = junit.read_text()
    for error in ElementTree.parse(junit).iter():
        frames = re.findall(r'File "([^"]+)"', error.text or "")
        assert not frames or "pytest_dflash" not in frames[-1], report  # where the error was raised
    cases = {case.get("name"): case for case in ElementTree.parse(junit).iter("testcase")}
    case = cases.get("test_says_on_after_the_reader_left")
    assert case is None or not list(case), report  # when recorded: passed (no failure, error or skip in it)


def test_the_direct_writer_stops_for_good_once_the_reader_is_gone() -> None:
    """os.write to a pipe whose reader closed: EPIPE. The line is dropped without raising, the descriptor copy is
    closed, and nothing is written to it again."""
    from pytest_dflash.report.progress import _Direct

    read_end, write_end = os.pipe()
    direct = _Direct(sys.stdout, write_end)
    direct.write("[dflash] before\n")
    assert os.read(read_end, 100) == b"[dflash] before\n"
    os.close(read_end)
    direct.write("[dflash] after the reader left\n")  # EPIPE: must not raise
    assert direct.gone and direct.fd is None
    with pytest.raises(OSError):
        os.fstat(write_end)  # closed by the writer, not left open for the next line to fail on
    direct.write("[dflash] later\n")  # a no-op
