"""Smoke: a fast slice through every layer — a verdict on one host in seconds.

    pytest --host local suites/smoke
    pytest --host ct200 suites/smoke --html reports/smoke.html
"""

from __future__ import annotations

import pytest

from pytest_dflash import generation, parity
from pytest_dflash.host import HostContext, ServiceHandle


@pytest.mark.host
def test_host_reachable(dflash_host: HostContext) -> None:
    if not dflash_host.has_host_access:
        pytest.skip("attached by URL: no host access")
    seconds = dflash_host.transport.ping()
    assert seconds < 6, f"a trivial command took {seconds:.1f}s"


@pytest.mark.service
def test_service_ready(dflash_service_raw: ServiceHandle) -> None:
    """Ready = a real greedy AND a real sampled (top-k/top-p) generation succeeded."""
    report = dflash_service_raw.ensure_ready()
    assert report.greedy_s is not None and report.sampled_s is not None


@pytest.mark.generation
def test_greedy_generation(dflash_service: ServiceHandle) -> None:
    generation.greedy(dflash_service.client, native=dflash_service.native)


@pytest.mark.generation
def test_sampled_generation(dflash_service: ServiceHandle) -> None:
    generation.sampled(dflash_service.client, native=dflash_service.native, seed=1234)


@pytest.mark.generation
def test_streamed_generation(dflash_service: ServiceHandle) -> None:
    generation.streamed(dflash_service.client, native=dflash_service.native)


@pytest.mark.parity
def test_greedy_parity(dflash_pair: tuple[ServiceHandle, ServiceHandle]) -> None:
    report = parity.compare_pair(*dflash_pair, parity.SMOKE_PROMPTS)
    assert not report.real, "\n".join(d.describe() for d in report.real)


@pytest.mark.perf
@pytest.mark.dflash_services(speculative=True)
def test_accept_length_reported(dflash_service: ServiceHandle) -> None:
    if not dflash_service.native:
        pytest.skip("accept length needs SGLang's native /generate meta_info")
    if dflash_service.algorithm == "NONE":
        pytest.skip(f"{dflash_service.label} does not use speculative decoding")
    value = generation.accept_length(dflash_service.client, parity.SMOKE_PROMPTS)
    dflash_service.host.facts[f"accept_length:{dflash_service.name}"] = value
    assert value >= 1.0, f"accept length {value:.2f} < 1: the verify step emits at least one token"
