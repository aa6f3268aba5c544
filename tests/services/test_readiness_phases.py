"""ReadinessWatcher + a real refserver process: the wait's heartbeats say the start-up phase the server's log shows
("in CUDA-graph capture for 3.0s"), the report carries the phases in order, and the memory is reported settled at
the 'KV Cache is allocated' lines, before the port opens (slow-graphs fault: 4 s of capture)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import httpx
import pytest

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.errors import DflashError, ServiceNotReady
from pytest_dflash.services.phases import PHASE_NAMES
from pytest_dflash.services.process import ProcessService
from pytest_dflash.services.readiness import ReadinessWatcher


def test_heartbeats_name_the_start_up_phase_and_the_report_has_the_phases(tmp_path: Path) -> None:
    spec = ServiceSpec(name="svc", kind="process", url="http://127.0.0.1:{port}", algorithm="DFLASH",
                       command=(sys.executable, "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port",
                                "{port}", "--speculative-algorithm", "DFLASH", "--inject", "slow-graphs=4"))
    service = ProcessService(spec, host="h", run_id="phases", python=sys.executable, log_dir=tmp_path)
    lines: list[str] = []
    settled: list[tuple[float, str]] = []
    mark = service.log_mark()
    service.start()
    try:
        client = InferenceClient(service.url, service="svc", timeout=httpx.Timeout(20, connect=5.0))
        watcher = ReadinessWatcher(service, client, native=True, budget_s=60, sampled_budget_s=60, log_mark=mark,
                                   progress=lines.append, progress_every_s=1.0,
                                   on_settled=lambda why: settled.append((time.monotonic(), why)))
        began = time.monotonic()
        report = watcher.wait()
    finally:
        service.stop()
    assert any(re.search(r"svc: waiting [\d.]+s in http phase: in CUDA-graph capture for [1-9][\d.]*s "
                         r"\(KV cache allocated at [\d.]+s\); ", line) for line in lines), lines
    assert list(report.phases) == list(PHASE_NAMES), report.phases  # DFLASH with graphs: every phase
    assert report.phases["cuda_graphs_captured"] - report.phases["kv_cache_allocated"] >= 3, report.phases
    assert report.as_dict()["phases"] == report.phases
    (at, why), = settled
    assert report.http_s is not None
    assert "KV cache was allocated" in why and at - began < report.http_s - 2  # at the pools, not at the port


def test_a_server_whose_log_says_nothing_of_its_pools_is_settled_when_its_port_opens(tmp_path: Path) -> None:
    """The second signal: no 'KV Cache is allocated' line (a server that is not SGLang, or no log to read), so the
    port's opening settles it; its report still has port_open (from HTTP)."""
    server = Path(__file__).parent / "last_words_server.py"
    spec = ServiceSpec(name="svc", kind="process", url="http://127.0.0.1:{port}", algorithm="NONE",
                       command=(sys.executable, str(server), "{port}"))
    service = ProcessService(spec, host="h", run_id="portsettles", python=sys.executable, log_dir=tmp_path)
    settled: list[str] = []
    mark = service.log_mark()
    service.start()
    try:
        client = InferenceClient(service.url, service="svc", timeout=httpx.Timeout(20, connect=5.0))
        watcher = ReadinessWatcher(service, client, native=True, budget_s=30, sampled_budget_s=30, log_mark=mark,
                                   on_settled=settled.append)
        with pytest.raises(ServiceNotReady, match="greedy request rejected"):  # its generations answer 500
            watcher.wait()
    finally:
        service.stop()
    assert len(settled) == 1 and settled[0].startswith("its port opened"), settled


def test_a_wait_that_fails_records_how_far_the_start_up_got(tmp_path: Path) -> None:
    """A DFLASH refserver that dies on its first sampled request (flashinfer-sm120): the wait fails, and
    `watcher.stopped` holds every phase its log and HTTP showed up to then (the port, the greedy answer), no
    sampled answer, and the time it waited; the cold-start timeline draws that row (report/plots.py)."""
    spec = ServiceSpec(name="svc", kind="process", url="http://127.0.0.1:{port}", algorithm="DFLASH",
                       command=(sys.executable, "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port",
                                "{port}", "--speculative-algorithm", "DFLASH", "--inject", "flashinfer-sm120"))
    service = ProcessService(spec, host="h", run_id="stopped", python=sys.executable, log_dir=tmp_path)
    mark = service.log_mark()
    service.start()
    try:
        client = InferenceClient(service.url, service="svc", timeout=httpx.Timeout(20, connect=5.0))
        watcher = ReadinessWatcher(service, client, native=True, budget_s=60, sampled_budget_s=60, log_mark=mark)
        assert watcher.stopped is None
        with pytest.raises(DflashError, match="first sampled"):
            watcher.wait()
    finally:
        service.stop()
    stopped = watcher.stopped
    assert stopped is not None
    assert stopped.http_s is not None and stopped.greedy_s is not None and stopped.sampled_s is None
    phases = list(stopped.phases)
    assert phases[:2] == ["process_started", "weights_loaded"] and phases[-2:] == ["port_open", "first_greedy"]
    assert "first_sampled" not in phases
    assert stopped.total_s >= stopped.phases["first_greedy"], (stopped.total_s, stopped.phases)
