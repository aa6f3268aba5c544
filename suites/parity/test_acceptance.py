"""Acceptance: how many tokens each speculative service emits per verify step, and DDTREE vs DFLASH.

    pytest --host local suites/parity -m perf
    pytest --host ct200 suites/parity --ddtree-accept-ratio 1.1

Accept length is speed, not correctness: these tests are in the perf layer. The numbers go into the
terminal summary and the verdict (services.<name>.accept_length, metrics."acceptance:<name>").
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_dflash.errors import DflashError
from pytest_dflash.layers.parity import acceptance
from pytest_dflash.layers.parity.hooks import ACCEPTANCE_PROMPTS, LayerOptions
from pytest_dflash.run.state import ServiceHandle

pytestmark = pytest.mark.perf


def _measure(service: ServiceHandle, options: LayerOptions,
             cache: dict[tuple[str, ...], Any]) -> acceptance.Acceptance:
    prompts = [*ACCEPTANCE_PROMPTS, *(p.text for p in options.extra_prompts)]
    key = ("acceptance", service.host.name, service.name, str(options.max_tokens), *prompts)
    if key not in cache:
        result = acceptance.measure(service.client, prompts, max_tokens=options.max_tokens)
        cache[key] = result
        service.host.facts[f"accept_length:{service.name}"] = round(result.mean, 4)
        service.host.facts.setdefault("metrics", {})[f"acceptance:{service.name}"] = result.as_fact()
    measured: acceptance.Acceptance = cache[key]
    return measured


@pytest.mark.dflash_services(speculative=True)
def test_accept_length(dflash_service: ServiceHandle, dflash_layer_options: LayerOptions,
                       dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """Per-request accept length from meta_info (else /server_info after /flush_cache) on everyday prompts; >= 1."""
    if not dflash_service.native:
        pytest.skip("accept length needs SGLang's native /generate meta_info or /server_info")
    acceptance.check_at_least_one(_measure(dflash_service, dflash_layer_options, dflash_run_cache))


@pytest.mark.dflash_services(algorithms=("DDTREE",))
def test_ddtree_accepts_at_least_dflash(dflash_service: ServiceHandle, dflash_layer_options: LayerOptions,
                                        dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """DDTREE's mean accept length >= ratio x DFLASH's on the same prompts (--ddtree-accept-ratio, default 1)."""
    ratio = dflash_layer_options.accept_ratio
    if ratio is None:
        pytest.skip("--ddtree-accept-ratio off")
    if not dflash_service.native:
        pytest.skip("accept length needs SGLang's native API")
    host = dflash_service.host
    linear = [name for name, spec in host.profile.services.items() if spec.algorithm == "DFLASH"]
    if not linear:
        pytest.skip(f"no DFLASH service on {host.name} to compare {dflash_service.name} with")
    ddtree = _measure(dflash_service, dflash_layer_options, dflash_run_cache)
    for name in linear:
        other = host.service(name)
        try:
            other.ensure_ready()
        except DflashError as exc:
            pytest.skip(f"blocked: {other.label} is not usable: {str(exc).splitlines()[0]}")
        dflash = _measure(other, dflash_layer_options, dflash_run_cache)
        host.facts.setdefault("metrics", {})[f"accept_ratio:{dflash_service.name}/{name}"] = round(
            ddtree.mean / dflash.mean, 4) if dflash.mean else None
        acceptance.check_ddtree_vs_dflash(ddtree, dflash, ratio=ratio)
