"""Smoke: a fast slice through every layer — a verdict on one host in seconds.

    pytest --host local suites/smoke
    pytest --host ct200 suites/smoke --html reports/smoke.html
"""

from __future__ import annotations

import pytest

from pytest_dflash.api import (
    GpuHost,
    HostContext,
    LayerOptions,
    PerfLayer,
    ServiceHandle,
    env,
    generation,
    host,
    parity,
    parity_checks,
    service_checks,
)


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


@pytest.mark.service
def test_serves_the_profiles_algorithm(dflash_service: ServiceHandle) -> None:
    """/server_info speculative_algorithm is the profile's algorithm (a DFLASH unit serving plain decoding fails)."""
    if reason := generation.served_algorithm_unknown(dflash_service):
        pytest.skip(reason)
    generation.check_served_algorithm(dflash_service)


@pytest.mark.service
def test_serves_one_consistent_model(dflash_service: ServiceHandle) -> None:
    """/v1/models, /model_info and /server_info name one model, the profile's `model` when set (no generation)."""
    service_checks.serves_one_consistent_model(dflash_service)


@pytest.mark.service
def test_serves_the_profiles_speculation(dflash_service: ServiceHandle) -> None:
    """The served speculation (/server_info, the log) is the command's: algorithm, draft tokens, no greedy fallback."""
    service_checks.serves_the_profiles_speculation(dflash_service)


@pytest.mark.generation
def test_greedy_generation(dflash_service: ServiceHandle) -> None:
    generation.greedy(dflash_service.client, native=dflash_service.native)


@pytest.mark.generation
def test_sampled_generation(dflash_service: ServiceHandle) -> None:
    generation.sampled(dflash_service.client, native=dflash_service.native, seed=1234)


@pytest.mark.generation
def test_streamed_generation(dflash_service: ServiceHandle) -> None:
    generation.streamed(dflash_service.client, native=dflash_service.native)


@pytest.mark.generation
def test_sampling_varies_with_seed(dflash_service: ServiceHandle) -> None:
    """At temperature 1 different seeds give different outputs beyond token 1 (a greedy-fallback verifier fails)."""
    generation.sampling_varies_with_seed(dflash_service)


@pytest.mark.parity
def test_greedy_parity(dflash_pair: tuple[ServiceHandle, ServiceHandle], dflash_layer_options: LayerOptions) -> None:
    """The smoke prompts are token-identical to the reference, or diverge at ties (at most max_tie_rate of them)."""
    parity.check_slice(*dflash_pair, parity.SMOKE_PROMPTS, dflash_layer_options)


@pytest.mark.perf
@pytest.mark.dflash_services(speculative=True)
def test_accept_length(dflash_service: ServiceHandle, dflash_layer_options: LayerOptions) -> None:
    """Drafts are really accepted: accept length on the smoke prompts >= [floors.SERVICE] accept_length, else >= 1.1
    (>= 1 for a profile's declared unaccepted_draft)."""
    parity_checks.quick_accept_length(dflash_service, parity.SMOKE_PROMPTS, dflash_layer_options)


@pytest.mark.perf
def test_per_token_latency(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """One streamed request: time per output token under a sanity ceiling (--tpot-ceiling-ms, default 250 ms)."""
    dflash_perf.token_latency_of(dflash_service)


# ---- GPU host: the cheapest decisive checks of the host and env layers (see suites/host, suites/env) ----
# Smoke runs a subset of the same layer functions as suites/host and suites/env, not copies of them.


@pytest.mark.host
def test_gpus_visible(dflash_gpu: GpuHost) -> None:
    """nvidia-smi lists every GPU the profile names (skips on a host that has none and names none)."""
    host.gpus_visible(dflash_gpu)


@pytest.mark.env
def test_serving_chains_import(dflash_gpu: GpuHost) -> None:
    """Every import chain the services need imports in a fresh interpreter of the server's venv."""
    env.serving_chains_import(dflash_gpu)


@pytest.mark.env
def test_torch_has_kernels_for_the_gpus(dflash_gpu: GpuHost) -> None:
    """torch in the server's venv initialises CUDA and has SASS/PTX for every GPU's compute capability."""
    env.torch_initialises_cuda(dflash_gpu)
    env.torch_arch_list_covers_gpus(dflash_gpu)
