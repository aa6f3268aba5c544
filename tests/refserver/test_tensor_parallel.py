"""The refserver as a tensor-parallel server (refserver/ranks.py): --tp-size N starts N real rank processes
titled like SGLang's, logging its per-rank lines, all of which must step for a token to come out; and the rank
faults, observed only from outside: process titles and states, HTTP, exit status and log text."""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from pytest_dflash.refserver.faults import parse_inject
from pytest_dflash.refserver.launch import RefServerExited, RefServerProcess

GREEDY = {"text": "The quick brown fox", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}


def _children(pid: int) -> dict[int, str]:
    """pid -> /proc cmdline of the server's direct children."""
    out = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(status.parent.name)
            out[child] = (status.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return out


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_tp2_runs_two_titled_rank_processes_and_serves() -> None:
    with RefServerProcess("--tp-size", "2", "--gpu-step-ms", "0") as server:
        titles = sorted(_children(server.pid).values())
        assert titles == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
        answer = httpx.post(server.url + "/generate", json=GREEDY, timeout=20)
        assert answer.status_code == 200 and answer.json()["meta_info"]["completion_tokens"] == 8
        log = server.log_text()
    for rank in (0, 1):
        for line in ("Init torch distributed begin.", "Init torch distributed ends.", "Load weight begin.",
                     "KV Cache is allocated.", "Memory pool end."):
            assert f" TP{rank}] {line}" in log


def test_a_stopped_rank_wedges_the_engine_and_a_resumed_one_frees_it() -> None:
    """Every rank steps every forward: one stopped rank holds every token (the H200 SIGSTOP wedge at TP)."""
    with RefServerProcess("--tp-size", "2", "--gpu-step-ms", "0") as server:
        rank1 = next(pid for pid, title in _children(server.pid).items() if title.endswith("_TP1"))
        server_pid = server.pid
        os.kill(rank1, signal.SIGSTOP)
        try:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(server.url + "/generate", json=GREEDY, timeout=httpx.Timeout(3, connect=2))
            assert _state(rank1) == "T" and _state(server_pid) in "SR"  # HTTP is up, the engine is not
        finally:
            os.kill(rank1, signal.SIGCONT)
        assert httpx.post(server.url + "/generate", json=GREEDY, timeout=20).status_code == 200


def test_rank_hang_fault_stops_the_rank_at_the_first_user_request() -> None:
    with RefServerProcess("--tp-size", "2", "--gpu-step-ms", "0", "--inject", "rank-hang=1") as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/generate", json=GREEDY, timeout=httpx.Timeout(3, connect=2))
        stopped = [title for pid, title in _children(server.pid).items() if _state(pid) == "T"]
        assert stopped == ["sglang::scheduler_TP1"]


def test_rank_crash_while_serving_ends_the_server_naming_the_rank() -> None:
    with RefServerProcess("--tp-size", "2", "--gpu-step-ms", "0", "--inject", "rank-crash=1@2") as server:
        rank1 = next(pid for pid, title in _children(server.pid).items() if title.endswith("_TP1"))
        assert httpx.post(server.url + "/generate", json=GREEDY, timeout=20).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.post(server.url + "/generate", json=GREEDY, timeout=20)
        assert server.wait_exit(timeout_s=20) in (137, -signal.SIGKILL)
        log = server.log_text()
    assert (f"Subprocess scheduler_1 (pid={rank1}) crashed with exit code -9. Triggering SIGQUIT for cleanup..."
            in log)
    assert "SIGQUIT received" in log and "kill_process_tree called" in log


@pytest.mark.parametrize(("fault", "rank_line"), [
    ("rank-crash=1", " TP1] Scheduler hit an exception: Traceback"),
    ("rank-oom=0", " TP0] Scheduler hit an exception: Traceback"),
])
def test_a_rank_that_fails_at_start_up_ends_the_launch(fault: str, rank_line: str) -> None:
    started = time.monotonic()
    with RefServerProcess("--tp-size", "2", "--inject", fault, wait_ready=False) as server:
        assert server.wait_exit(timeout_s=30) in (137, -signal.SIGKILL)
        log = server.log_text()
    assert time.monotonic() - started < 30
    assert rank_line in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "Uvicorn running" not in log
    if fault.startswith("rank-oom"):
        assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in log


def test_nccl_init_hang_never_leaves_nccl_init() -> None:
    with RefServerProcess("--tp-size", "2", "--inject", "nccl-init-hang", wait_ready=False) as server:
        time.sleep(4)
        log = server.log_text()
        assert server.returncode is None
    assert " TP0] Init torch distributed begin." in log and " TP1] Init torch distributed begin." in log
    assert "Init torch distributed ends." not in log and "Uvicorn running" not in log


@pytest.mark.parametrize(("args", "message"), [
    (("--tp-size", "2", "--inject", "rank-crash=2"), "there is no rank 2 with --tp-size 2"),
    (("--inject", "nccl-init-hang"), "nccl-init-hang needs --tp-size 2 or more"),
])
def test_a_rank_fault_the_launch_cannot_have_is_refused(args: tuple[str, ...], message: str) -> None:
    with RefServerProcess(*args, wait_ready=False) as server:
        assert server.wait_exit(timeout_s=30) != 0
        assert message in server.log_text()


def test_refused_rank_fault_values() -> None:
    assert parse_inject("rank-crash=0") == {"rank-crash": 0.0}
    assert parse_inject("rank-crash=1@3") == {"rank-crash": 1.0, "rank-crash@": 3.0}
    for bad in ("rank-oom=1@2", "rank-hang=-1", "rank-crash=1@0", "rank-crash"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_inject(bad)


def test_exited_error_is_raised_for_a_rank_that_fails_while_waiting_ready() -> None:
    with (pytest.raises(RefServerExited, match="Received sigquit from a child process"),
          RefServerProcess("--tp-size", "2", "--inject", "rank-crash=0", timeout_s=30)):
        pass
