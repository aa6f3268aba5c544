"""An HTTP 5xx to a readiness request may be a dying server's last answer: the verdict names the death.

Real processes on 127.0.0.1 (tests/services/last_words_server.py): generations answer 500, then the process
exits 1 a moment later — or stays up. Started as a process (state from the OS) the death is a ServiceCrashed;
attached by URL it is a ServiceGone ("answered HTTP 500, then connections refused"). A server that answers
500 and stays up is still "rejected", after a bounded look (LAST_WORDS_S), never a wait for the budget.
Under CI load a crash-looping unit's 500 was reported as "request rejected", hiding the restart.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.errors import ServiceCrashed, ServiceGone, ServiceNotReady
from pytest_dflash.services.base import ServiceManager
from pytest_dflash.services.external import ExternalService
from pytest_dflash.services.process import ProcessService
from pytest_dflash.services.readiness import LAST_WORDS_S, ReadinessWatcher

SERVER = Path(__file__).with_name("last_words_server.py")
GREEDY_REQUEST = "POST /generate (max_new_tokens 8, temperature 0.0)"
Start = Callable[..., ProcessService]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """start(*args) -> a running ProcessService of last_words_server.py; stopped at teardown."""
    started: list[ProcessService] = []

    def make(*args: str) -> ProcessService:
        spec = ServiceSpec(name="svc", kind="process", url="http://127.0.0.1:{port}", algorithm="NONE",
                           command=(sys.executable, str(SERVER), "{port}", *args))
        service = ProcessService(spec, host="h", run_id="lastwords", python=sys.executable, log_dir=tmp_path)
        service.start()
        started.append(service)
        with httpx.Client() as http:  # up: answers /v1/models
            deadline = time.monotonic() + 20
            while True:
                try:
                    if http.get(f"{service.url}/v1/models", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        return service

    yield make
    for service in started:
        service.stop()


def watcher(service: ServiceManager, url: str) -> ReadinessWatcher:
    client = InferenceClient(url, service="svc", timeout=httpx.Timeout(10.0, connect=5.0))
    return ReadinessWatcher(service, client, native=True, budget_s=60, sampled_budget_s=60, request_timeout_s=10)


def test_a_500_then_the_process_exits_is_a_crash(start: Start) -> None:
    service = start("0.3")
    began = time.monotonic()
    with pytest.raises(ServiceCrashed) as caught:
        watcher(service, service.url).wait()
    assert time.monotonic() - began < LAST_WORDS_S + 1
    assert "died during readiness: first greedy generation" in str(caught.value)
    assert "exited with status 1" in str(caught.value), str(caught.value)
    assert "Exception in ASGI application" in caught.value.log_tail


def test_a_500_then_connections_refused_is_gone_when_attached_by_url(start: Start) -> None:
    service = start("0.3")
    spec = ServiceSpec(name="svc", kind="external", url=service.url, algorithm="NONE")
    with pytest.raises(ServiceGone) as caught:
        watcher(ExternalService(spec), service.url).wait()
    text = str(caught.value)
    assert f"{GREEDY_REQUEST} killed it: answered HTTP 500, then connections refused" in text, text


@pytest.mark.parametrize("attached", [False, True], ids=["process", "url"])
def test_a_500_from_a_server_that_stays_up_is_rejected_after_a_bounded_look(start: Start, attached: bool) -> None:
    service = start()
    manager: ServiceManager = service
    if attached:
        manager = ExternalService(ServiceSpec(name="svc", kind="external", url=service.url, algorithm="NONE"))
    began = time.monotonic()
    with pytest.raises(ServiceNotReady) as caught:
        watcher(manager, service.url).wait()
    took = time.monotonic() - began
    assert LAST_WORDS_S <= took < LAST_WORDS_S + 2, took
    assert "greedy request rejected" in str(caught.value) and "HTTP 500" in str(caught.value)
    assert service.state().running  # it did not die: the look was only a look
