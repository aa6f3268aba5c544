"""Parity layer: speculative decoding is lossless. DDTREE == DFLASH == the target, greedy and sampled.

    pytest --host local suites/parity
    pytest --host ct200 --provision suites/parity --parity-prompts my_prompts.json

Pairs come from the profile's [parity] table (reference ~ each compared service). Greedy divergences
are triaged with a non-speculative server's top logprobs (docs/generation-parity.md: the tie rule);
sampled outputs are compared as distributions with a chi-square test of homogeneity.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_dflash.layers.generation import checks as generation
from pytest_dflash.layers.parity import greedy as parity
from pytest_dflash.layers.parity.distribution import compare_distributions
from pytest_dflash.layers.parity.hooks import DISTRIBUTION_PROMPTS, LayerOptions, reference_samples
from pytest_dflash.run.state import ServiceHandle

pytestmark = pytest.mark.parity
Pair = tuple[ServiceHandle, ServiceHandle]


def _native(pair: Pair) -> None:
    for service in pair:
        if not service.native:
            pytest.skip(f"parity compares token ids: {service.label} does not serve SGLang's native /generate")


def _metrics(service: ServiceHandle) -> dict[str, Any]:
    metrics: dict[str, Any] = service.host.facts.setdefault("metrics", {})
    return metrics


def _greedy(pair: Pair, options: LayerOptions, cache: dict[tuple[str, ...], Any], *,
            concurrent_requests: bool) -> parity.ParityReport:
    reference, compared = pair
    spec = reference.host.profile.parity
    prompts = options.prompts(spec.prompts if spec else None)
    def alone(service: ServiceHandle) -> Any:
        key = ("greedy", service.host.name, service.name, str(options.max_tokens), *(p.text for p in prompts))
        if key not in cache:
            cache[key] = parity.greedy_outputs(service.client, prompts, max_tokens=options.max_tokens)
        return cache[key]

    return parity.compare_pair(reference, compared, prompts, max_tokens=options.max_tokens, tie_gap=options.tie_gap,
                               max_tie_rate=options.max_tie_rate, plain_port=options.plain_port,
                               concurrent_requests=concurrent_requests, reference_outputs=alone(reference),
                               compared_alone=alone(compared) if concurrent_requests else None,
                               noise_gap=options.noise_gap)


def test_greedy_parity(dflash_pair: Pair, dflash_layer_options: LayerOptions,
                       dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """Temperature 0, one prompt at a time: token-identical to the reference, or diverging only at ties."""
    _native(dflash_pair)
    report = _greedy(dflash_pair, dflash_layer_options, dflash_run_cache, concurrent_requests=False)
    _metrics(dflash_pair[0])[f"parity:{dflash_pair[0].name}~{dflash_pair[1].name}"] = report.as_fact()
    report.check()


def test_greedy_parity_concurrent(dflash_pair: Pair, dflash_layer_options: LayerOptions,
                                  dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """The same prompts sent to the compared service all at once (one batch): still lossless.

    A small divergence on a prompt the service gets right alone is numerical noise (counted with ties)."""
    _native(dflash_pair)
    report = _greedy(dflash_pair, dflash_layer_options, dflash_run_cache, concurrent_requests=True)
    _metrics(dflash_pair[0])[f"parity-concurrent:{dflash_pair[0].name}~{dflash_pair[1].name}"] = report.as_fact()
    report.check()


def test_distribution_parity(dflash_pair: Pair, dflash_layer_options: LayerOptions,
                             dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """Sampled: the first K tokens follow the reference's distribution (chi-square test; too few samples fail)."""
    _native(dflash_pair)
    reference, compared = dflash_pair
    options = dflash_layer_options
    cache = reference_samples(dflash_run_cache, reference.host.name, reference.name, options.draw)
    report = compare_distributions(reference.client, compared.client, DISTRIBUTION_PROMPTS, options.draw,
                                   alpha=options.alpha, min_samples=options.min_samples, reference_samples=cache)
    _metrics(reference)[f"distribution:{reference.name}~{compared.name}"] = report.as_fact()
    evidence = ""
    if report.outcome == "fail":
        for service in (compared, reference):
            line = generation.service_log_line(service, generation.GREEDY_FALLBACK_LINE)
            if line:
                evidence += f"{service.label}'s log says: {line}\n"
    report.check(evidence=evidence.strip(), min_samples=options.min_samples)
