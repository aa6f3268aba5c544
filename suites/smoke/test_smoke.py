"""Smoke: a fast slice through every layer — a verdict on one host in seconds.

    pytest --host local suites/smoke
    pytest --host ct200 suites/smoke --html reports/smoke.html
"""

from __future__ import annotations

import pytest

from pytest_dflash.api import (
    SMOKE_PROMPTS,
    GpuHost,
    HostContext,
    LayerOptions,
    PerfLayer,
    ServiceHandle,
    check_slice,
    forced_tool_call,
    gpus_visible,
    greedy,
    not_applicable,
    quick_accept_length,
    ready_by_real_generation,
    sampled,
    sampling_varies_with_seed,
    serves_one_consistent_model,
    serves_structured_output,
    serves_the_commands_configuration,
    serves_the_profiles_algorithm,
    serves_the_profiles_speculation,
    serving_chains_import,
    streamed,
    torch_arch_list_covers_gpus,
    torch_initialises_cuda,
)


@pytest.mark.host
def test_host_reachable(dflash_host: HostContext) -> None:
    """A trivial command on the host answers within 6 s (skipped when attached by URL: no host access)."""
    if not dflash_host.has_host_access:
        not_applicable("attached by URL: no host access")
    seconds = dflash_host.transport.ping()
    assert seconds < 6, f"a trivial command took {seconds:.1f}s"


@pytest.mark.service
def test_service_ready(dflash_service_raw: ServiceHandle) -> None:
    """Ready = a real greedy AND a real sampled (top-k/top-p) generation succeeded."""
    ready_by_real_generation(dflash_service_raw)


@pytest.mark.service
def test_serves_the_profiles_algorithm(dflash_service: ServiceHandle) -> None:
    """/server_info speculative_algorithm is the profile's algorithm (a DFLASH unit serving plain decoding
    fails)."""
    serves_the_profiles_algorithm(dflash_service)


@pytest.mark.service
def test_serves_one_consistent_model(dflash_service: ServiceHandle) -> None:
    """/v1/models, /model_info and /server_info name one model, the profile's `model` when set (no
    generation)."""
    serves_one_consistent_model(dflash_service)


@pytest.mark.service
def test_serves_the_profiles_speculation(dflash_service: ServiceHandle) -> None:
    """The served speculation (/server_info, the log) is the command's: algorithm, draft tokens, no greedy
    fallback."""
    serves_the_profiles_speculation(dflash_service)


@pytest.mark.service
def test_serves_the_commands_configuration(dflash_service: ServiceHandle) -> None:
    """/server_info's parsers, grammar backend and parallel sizes are what the command sets (no request);
    skipped without a command."""
    serves_the_commands_configuration(dflash_service)


@pytest.mark.generation
def test_greedy_generation(dflash_service: ServiceHandle) -> None:
    """temperature 0: max_tokens tokens, finish_reason 'length' (ignore_eos)."""
    greedy(dflash_service.client, native=dflash_service.native)


@pytest.mark.generation
def test_sampled_generation(dflash_service: ServiceHandle) -> None:
    """A seeded sampled request (temperature 0.8, top_k 20, top_p 0.9) runs to max_tokens."""
    sampled(dflash_service.client, native=dflash_service.native, seed=1234)


@pytest.mark.generation
def test_streamed_generation(dflash_service: ServiceHandle) -> None:
    """A greedy streamed request: well-formed SSE up to data: [DONE], max_tokens tokens."""
    streamed(dflash_service.client, native=dflash_service.native)


@pytest.mark.generation
def test_sampling_varies_with_seed(dflash_service: ServiceHandle) -> None:
    """At temperature 1 different seeds give different outputs beyond token 1 (a greedy-fallback verifier
    fails)."""
    sampling_varies_with_seed(dflash_service)


@pytest.mark.generation
def test_structured_output(dflash_service: ServiceHandle) -> None:
    """One greedy json_schema request: the output is in the schema (a server launched with --grammar-backend
    none, or one that ignores the grammar, fails unless its profile says structured_output = false)."""
    serves_structured_output(dflash_service)


@pytest.mark.generation
def test_forced_tool_call(dflash_service: ServiceHandle) -> None:
    """Where it serves a --tool-call-parser: one sampled tool_choice "required" call comes back complete, of a
    given tool, with valid arguments (a server that ignores tools, or forces calls only for greedy requests,
    fails); does not apply without a parser."""
    forced_tool_call(dflash_service, "required", sampled=True)


@pytest.mark.parity
def test_greedy_parity(dflash_pair: tuple[ServiceHandle, ServiceHandle],
                       dflash_layer_options: LayerOptions) -> None:
    """The smoke prompts are token-identical to the reference, or diverge at ties (at most max_tie_rate of
    them)."""
    check_slice(*dflash_pair, SMOKE_PROMPTS, dflash_layer_options)


@pytest.mark.perf
@pytest.mark.dflash_services(speculative=True)
def test_accept_length(dflash_service: ServiceHandle, dflash_layer_options: LayerOptions) -> None:
    """Drafts are really accepted: accept length on the smoke prompts >= [floors.SERVICE] accept_length, else
    >= 1.1 (>= 1 for a profile's declared unaccepted_draft)."""
    quick_accept_length(dflash_service, SMOKE_PROMPTS, dflash_layer_options)


@pytest.mark.perf
def test_per_token_latency(dflash_service: ServiceHandle, dflash_perf: PerfLayer) -> None:
    """One streamed request: time per output token under a sanity ceiling (--tpot-ceiling-ms, default
    250 ms)."""
    dflash_perf.token_latency_of(dflash_service)


# ---- GPU host: the cheapest decisive checks of the host and env layers (see suites/host, suites/env) ----
# Smoke runs a subset of the same layer functions as suites/host and suites/env, not copies of them.


@pytest.mark.host
def test_gpus_visible(dflash_gpu: GpuHost) -> None:
    """nvidia-smi lists every GPU the profile names (skips on a host that has none and names none)."""
    gpus_visible(dflash_gpu)


@pytest.mark.env
def test_serving_chains_import(dflash_gpu: GpuHost) -> None:
    """Every import chain the services need imports in a fresh interpreter of the server's venv."""
    serving_chains_import(dflash_gpu)


@pytest.mark.env
def test_torch_has_kernels_for_the_gpus(dflash_gpu: GpuHost) -> None:
    """torch in the server's venv initialises CUDA and has SASS/PTX for every GPU's compute capability."""
    torch_initialises_cuda(dflash_gpu)
    torch_arch_list_covers_gpus(dflash_gpu)
