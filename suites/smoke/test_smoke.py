"""Smoke: a fast slice through every layer — a verdict on one host in seconds.

    pytest --host local suites/smoke
    pytest --host ct200 suites/smoke --html reports/smoke.html
"""

from __future__ import annotations

import pytest

from pytest_dflash.layers.generation import checks as generation
from pytest_dflash.layers.gpu import GpuHost
from pytest_dflash.layers.gpu.checks import chain_failure, torch_coverage
from pytest_dflash.layers.gpu.report import explain
from pytest_dflash.layers.parity import greedy as parity
from pytest_dflash.run.state import HostContext, ServiceHandle


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


# ---- GPU host: the cheapest decisive checks of the host and env layers (see suites/host, suites/env) ----


@pytest.mark.host
def test_gpus_visible(dflash_gpu: GpuHost) -> None:
    """nvidia-smi lists every GPU the profile names (skips on a host that has none and names none)."""
    if not dflash_gpu.host.has_host_access:
        pytest.skip("attached by URL: no host access")
    inventory = dflash_gpu.inventory
    if not inventory.gpus and not dflash_gpu.expected_gpus:
        pytest.skip(dflash_gpu.no_gpu_reason())
    present = [g.index for g in inventory.gpus]
    missing = [i for i in dflash_gpu.expected_gpus if i not in present]
    assert inventory.available and not missing, explain(
        f"GPUs {missing or list(dflash_gpu.expected_gpus)} of the profile are not visible: "
        f"{inventory.reason or f'nvidia-smi lists {present}'}")


@pytest.mark.env
def test_serving_chains_import(dflash_gpu: GpuHost) -> None:
    """Every import chain the services need imports in a fresh interpreter of the server's venv."""
    if not dflash_gpu.host.has_host_access or not dflash_gpu.groups:
        pytest.skip("no service with host access")
    failures = []
    for group in dflash_gpu.groups:
        probe = dflash_gpu.import_chains(group)
        if "transport_error" in probe:
            failures.append(probe["transport_error"])
            continue
        for result in probe["chains"]:
            failure = chain_failure(result)
            if failure is not None:
                failures.append(failure.evidence())
    assert not failures, explain(f"the serving chain does not import with {dflash_gpu.host.profile.python}",
                                 "\n\n".join(failures), values={"python": dflash_gpu.host.profile.python})


@pytest.mark.env
def test_torch_has_kernels_for_the_gpus(dflash_gpu: GpuHost) -> None:
    """torch in the server's venv initialises CUDA and has SASS/PTX for every GPU's compute capability."""
    if not dflash_gpu.host.has_host_access or not dflash_gpu.groups:
        pytest.skip("no service with host access")
    if not dflash_gpu.has_gpu:
        pytest.skip(dflash_gpu.no_gpu_reason())
    raw = dflash_gpu.torch_facts(dflash_gpu.groups[0])
    torch = raw.get("torch") or {}
    assert torch.get("cuda_available"), explain(f"torch cannot use the GPUs with {dflash_gpu.host.profile.python}",
                                                str(raw.get("import_error") or torch.get("warnings") or raw))
    gaps = [c.describe() for c in torch_coverage(torch["arch_list"], dflash_gpu.inventory.capabilities) if not c.ok]
    assert not gaps, explain(f"torch {torch['version']} has no kernels for these GPUs", "\n".join(gaps),
                             diagnosis="no-kernel-image")
