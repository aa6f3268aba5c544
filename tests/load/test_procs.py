"""One load run over several client processes (LoadSpec.client_procs) against the real synthetic server."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.load import LengthDist, LoadSpec, run_load
from pytest_dflash.load.procs import ClientProcessError

SynthFactory = Callable[..., Any]  # conftest.Synth: .url, .stats(), .get(path)


def test_two_processes_send_the_requests_of_one(synth: SynthFactory) -> None:
    """Same count, same token totals, and request i has the same seeded prompt and lengths in both runs."""
    srv = synth("--tokens", "64", "--honor-max-tokens", "--ttft-ms", "2", "--itl-ms", "1")
    base = dict(concurrency=4, num_requests=30, warmup_requests=5, seed=7,
                prompt_len=LengthDist(kind="normal", mean=40, stdev=15),
                output_len=LengthDist(kind="uniform", mean=20, low=4, high=40))
    one = run_load(srv.url, LoadSpec(**base, client_procs=1), progress=False)  # type: ignore[arg-type]
    two = run_load(srv.url, LoadSpec(**base, client_procs=2), progress=False)  # type: ignore[arg-type]
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        assert one.metrics[key] == two.metrics[key], key
    assert two.metrics["completed"] == 30 and two.saturation.processes == 2

    def rows(r: Any) -> list[tuple[Any, ...]]:  # prompt_tokens: the server's word count of the prompt it got
        return [(x.index, x.warmup, x.prompt_len, x.max_tokens, x.prompt_tokens, x.output_tokens) for x in r.records]

    assert rows(one) == rows(two)
    assert [x.index for x in two.records] == list(range(35))
    assert len({x.max_tokens for x in two.records}) > 5  # the lengths really were drawn per request
    assert srv.get("/counters")["requests"] == 70
    warm_end = max(x.end_s or 0.0 for x in two.records if x.warmup)
    assert all(x.start_s >= warm_end for x in two.records if not x.warmup)  # both processes warm before measuring


def test_open_loop_schedule_is_the_one_process_schedule(synth: SynthFactory) -> None:
    srv = synth("--tokens", "2", "--ttft-ms", "1", "--itl-ms", "0")
    spec = dict(request_rate=80.0, num_requests=24, output_len=2, seed=3, concurrency=8)
    one = run_load(srv.url, LoadSpec(**spec), progress=False)  # type: ignore[arg-type]
    two = run_load(srv.url, LoadSpec(**spec, client_procs=2), progress=False)  # type: ignore[arg-type]

    def planned(r: Any) -> list[float]:
        first = r.records[0].scheduled_s
        return [rec.scheduled_s - first for rec in r.records]

    assert two.metrics["completed"] == 24
    assert planned(one) == pytest.approx(planned(two), abs=1e-9)


def test_a_child_killed_mid_run_fails_the_run_at_once_with_its_evidence(synth: SynthFactory) -> None:
    srv = synth("--tokens", "2000", "--ttft-ms", "1", "--itl-ms", "5")  # 10 s a request: the run outlasts the kill
    killed: list[int] = []

    def kill_one() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            children = multiprocessing.active_children()
            if len(children) == 2 and srv.get("/counters")["requests"] >= 2:  # both are streaming
                pid = children[0].pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(ClientProcessError) as info:
        run_load(srv.url, LoadSpec(concurrency=2, duration_s=60, output_len=2000, client_procs=2), progress=False)
    killer.join(timeout=5)
    assert killed, "no client process to kill"
    assert time.monotonic() - t0 < 15  # not the 60 s run, nor the 10 s requests
    message = str(info.value)
    assert f"(pid {killed[0]}) died during the measured phase: killed by SIGKILL" in message, message
    assert "\n" not in message
    assert multiprocessing.active_children() == []  # the other one was stopped too


def test_a_child_that_raises_reports_its_traceback_tail(synth: SynthFactory, tmp_path: Path) -> None:
    srv = synth("--tokens", "4", "--ttft-ms", "1", "--itl-ms", "0")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ClientProcessError, match=r"failed during the warm-up: .*DatasetError: .*bad.jsonl:1"):
        run_load(srv.url, LoadSpec(concurrency=2, num_requests=4, dataset=str(bad), client_procs=2), progress=False)
    assert multiprocessing.active_children() == []


def test_more_processes_than_requests_in_flight_is_refused() -> None:
    with pytest.raises(ValueError, match=r"client_procs \(3\) > concurrency \(2\)"):
        LoadSpec(concurrency=2, num_requests=4, client_procs=3)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cli_signal_stops_every_client_process(synth: SynthFactory, sig: signal.Signals) -> None:
    srv = synth("--tokens", "2000", "--ttft-ms", "1", "--itl-ms", "5")
    proc = subprocess.Popen([sys.executable, "-m", "pytest_dflash.load", srv.url, "--client-procs", "2",
                             "--concurrency", "2", "--duration", "60", "--output-len", "2000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while srv.get("/counters")["requests"] < 2:  # both client processes are streaming
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the client processes never sent a request"
            time.sleep(0.05)
        children = _children(proc.pid)
        assert len(children) >= 2, children
        proc.send_signal(sig)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode != 0
    gone_by = time.monotonic() + 5
    while any(_alive(pid) for pid in children) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children), children


def test_cli_client_procs_writes_one_merged_result(synth: SynthFactory, tmp_path: Path) -> None:
    srv = synth("--tokens", "8", "--ttft-ms", "1", "--itl-ms", "1")
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "pytest_dflash.load", srv.url, "--client-procs", "2",
                           "--concurrency", "4", "--num-requests", "12", "--output-len", "8", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["completed"] == 12 and doc["total_output_tokens"] == 96
    assert doc["saturation"]["processes"] == 2 and doc["spec"]["client_procs"] == 2
    assert sorted(r["index"] for r in doc["requests"]) == list(range(12))
