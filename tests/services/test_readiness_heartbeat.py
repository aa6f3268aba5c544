"""Readiness heartbeats keep their own clock (services/readiness.py): a wait loop held inside one call is still
heard on time, and the heartbeat says that a check has not returned. A real refserver behind a proxy that answers
GET /v1/models 429 for the first 6.5 s and leaves /server_info unanswered: the loop then sits 5 s (the client's
timeout) inside the server-info call, across the 10 s heartbeat (before, the heartbeat waited for the loop: at
11.5 s or later)."""

from __future__ import annotations

import time
from typing import Any

import httpx
from http_doubles import FaultProxy, Reply

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.services.events import Heartbeat
from pytest_dflash.services.external import ExternalService
from pytest_dflash.services.readiness import ReadinessWatcher


def test_a_heartbeat_comes_on_time_while_the_wait_is_inside_a_call(refserver: RefServerProcess) -> None:
    opens = time.monotonic() + 6.5

    def rule(method: str, path: str, body: Any) -> Reply | None:
        if path == "/v1/models" and time.monotonic() < opens:
            return Reply(429, b'{"error": "not yet"}')
        if path in ("/server_info", "/get_server_info"):
            time.sleep(7.0)  # past the client's 5 s
            return Reply(503, b"{}")
        return None

    said: list[tuple[float, str]] = []
    with FaultProxy(refserver.url, rule) as proxy:
        spec = ServiceSpec(name="svc", kind="external", url=proxy.url, algorithm="NONE")
        client = InferenceClient(proxy.url, service="svc", timeout=httpx.Timeout(5.0, connect=5.0))
        watcher = ReadinessWatcher(ExternalService(spec), client, native=None, budget_s=60, sampled_budget_s=60,
                                   request_timeout_s=5.0, progress=lambda line: said.append((time.monotonic(), line)),
                                   label="h/svc")
        started = time.monotonic()
        watcher.wait()
    beats = [(at - started, line) for at, line in said if isinstance(line, Heartbeat)]
    assert beats, said
    at, line = beats[0]
    assert 9.5 <= at < 11.0, beats  # on time, although the loop was inside the server-info call
    assert line.startswith("h/svc: waiting 10.0s in http phase: "), line
    assert "; a check has not returned for " in line, line
