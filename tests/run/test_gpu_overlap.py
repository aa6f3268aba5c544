"""run/state.py: services that share a (declared) GPU. The second starts once the first's GPU memory is settled (its
'KV Cache is allocated' pool lines are over), not after its readiness, so the first's long tail (CUDA-graph capture:
the slow-graphs fault; the first sampled request's JIT: cold-jit) overlaps the second's start; a death of the first
during that overlap still fails its wait at once, with its log, and the second goes on to its own verdict. Real
refserver processes, a real run state."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.errors import ServiceCrashed
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun

PROFILE = """
[host]
connection = "local://"
python = "{python}"
provision = "always"

[services.a]
kind = "process"
algorithm = "NONE"
gpus = [0]
command = ["{{python}}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{{port}}",
           "--speculative-algorithm", "NONE", "--inject", "{faults}"]
ready_timeout = "60s"

[services.b]
kind = "process"
algorithm = "NONE"
gpus = [{b_gpu}]
command = ["{{python}}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{{port}}",
           "--speculative-algorithm", "NONE"]
ready_timeout = "60s"
"""


def one_gpu_host(tmp_path: Path, faults: str, *, b_gpu: int = 0) -> tuple[DflashRun, list[str]]:
    os.environ.setdefault("DFLASH_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "h.toml"
    path.write_text(PROFILE.format(python=sys.executable, faults=faults, b_gpu=b_gpu))
    run = DflashRun({"h": load_profile(path, name="h")}, RunOptions(provision=True), f"overlap{os.getpid()}")
    lines: list[str] = []
    run.progress = lambda line: lines.append(f"{time.monotonic():.3f} {line}")
    run.host("h").needed.update({"a", "b"})
    return run, lines


def started_at(lines: list[str], service: str) -> float:
    return next(float(line.split()[0]) for line in lines if f"h/{service}: started" in line)


def test_the_second_service_on_a_gpu_starts_at_the_firsts_kv_allocation_not_its_readiness(tmp_path: Path) -> None:
    run, lines = one_gpu_host(tmp_path, "slow-graphs=4,cold-jit=3")
    try:
        a = run.host("h").service("a").ensure_ready()
        b = run.host("h").service("b").ensure_ready()
    finally:
        assert run.cleanup() == []
    # a: KV pools at ~1 s, then 4 s of CUDA-graph capture before its port, then a 3 s warm-up and a 3 s JIT
    assert list(a.phases)[:5] == ["process_started", "weights_loaded", "kv_cache_allocated",
                                  "cuda_graphs_captured", "port_open"], a.phases
    assert a.phases["port_open"] - a.phases["kv_cache_allocated"] >= 3, a.phases
    b_start = b.waited_from - a.waited_from  # b's wait begins as it is started
    # at a's allocation (its log has whole seconds; read every 1 s), during its CUDA-graph capture: not after
    assert a.phases["kv_cache_allocated"] - 1.0 <= b_start < a.phases["port_open"], (b_start, a.phases)
    assert b_start < a.total_s - 5, (b_start, a.total_s)
    said = next(line for line in lines if "h/b: started" in line)
    assert "was settled (a: its KV cache was allocated (its log's pool lines))" in said, said
    assert any("h/b: starts once the KV cache of a is allocated (shared GPU 0" in line for line in lines), lines
    assert b.phases["first_sampled"] == pytest.approx(b.total_s, abs=0.001)


def test_a_death_of_the_first_during_the_overlap_fails_its_wait_at_once_and_the_second_goes_on(
        tmp_path: Path) -> None:
    """a is killed (SIGKILL, as the OOM killer does) in its 8 s CUDA-graph capture, once b has started at its KV
    allocation: a's wait fails within a poll, with its log; b becomes ready on its own."""
    run, lines = one_gpu_host(tmp_path, "slow-graphs=8,cold-jit=3")
    a_handle = run.host("h").service("a")
    killed: list[float] = []

    def kill_a_once_b_started() -> None:
        deadline = time.monotonic() + 30
        while not any("h/b: started" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = a_handle.manager.state().pid
        assert pid is not None
        killed.append(time.monotonic())
        os.killpg(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_a_once_b_started, daemon=True)
    try:
        killer.start()
        with pytest.raises(ServiceCrashed) as crashed:
            a_handle.ensure_ready()
        seen = time.monotonic()
        killer.join(5)
        b = run.host("h").service("b").ensure_ready()
    finally:
        assert run.cleanup() == []
    assert killed and seen - killed[0] < 1.5, (killed, seen)  # at once: the state poll, not a's budget
    assert "killed by SIGKILL" in str(crashed.value), str(crashed.value)
    assert "Capture target prefill CUDA graph begin" in crashed.value.log_tail  # the evidence: where it was
    assert started_at(lines, "b") < killed[0]  # b was started during the overlap, before a died
    assert b.sampled_s is not None  # and became ready on its own


def test_a_service_waiting_for_its_gpu_neighbour_is_never_started_once_the_run_ends(tmp_path: Path) -> None:
    """The run's cleanup (session end, Ctrl-C, SIGTERM) while b waits for a's memory: b is not started after it
    (its wait ends within a poll), a is stopped, and no 'failed' line is said for b."""
    run, lines = one_gpu_host(tmp_path, "slow-graphs=30")
    host = run.host("h")
    a, b = host.service("a"), host.service("b")
    host.prestart(a)  # starts a, queues b behind it; no readiness wait for a here: it never settles
    assert a.manager.provisioned and not b.manager.provisioned and b._background is not None
    thread = b._background
    assert run.cleanup() == []
    thread.join(2)
    assert not thread.is_alive() and not b.manager.provisioned
    assert "the run is ending" in str(b.failure)
    assert a.manager.state().running is False
    assert [line for line in lines if "h/b: started" in line or "h/b: not started" in line] == []


def test_services_on_different_gpus_still_start_at_once(tmp_path: Path) -> None:
    run, lines = one_gpu_host(tmp_path, "slow-graphs=4", b_gpu=1)
    try:
        a = run.host("h").service("a").ensure_ready()
        b = run.host("h").service("b").ensure_ready()
    finally:
        assert run.cleanup() == []
    assert started_at(lines, "b") - started_at(lines, "a") < 1.0, lines  # not at a's KV allocation: at once
    said = next(line for line in lines if "h/b: started" in line)
    assert "settled" not in said, said  # not queued behind a
    assert b.waited_from - a.waited_from < a.phases["port_open"] - 2, (a.phases, b.waited_from - a.waited_from)
