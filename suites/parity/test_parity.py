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

from pytest_dflash.api import (
    LayerOptions,
    ServiceHandle,
    distribution_parity,
    greedy_parity,
    structured_parity,
)

pytestmark = pytest.mark.parity
Pair = tuple[ServiceHandle, ServiceHandle]


def test_greedy_parity(dflash_pair: Pair, dflash_layer_options: LayerOptions,
                       dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """Temperature 0, one prompt at a time: token-identical to the reference, or diverging only at ties."""
    greedy_parity(dflash_pair, dflash_layer_options, dflash_run_cache, concurrent_requests=False)


def test_greedy_parity_concurrent(dflash_pair: Pair, dflash_layer_options: LayerOptions,
                                  dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """The same prompts sent to the compared service all at once (one batch): still lossless.

    A small divergence on a prompt the service gets right alone is numerical noise (counted with ties)."""
    greedy_parity(dflash_pair, dflash_layer_options, dflash_run_cache, concurrent_requests=True)


def test_distribution_parity(dflash_pair: Pair, dflash_layer_options: LayerOptions,
                             dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """Sampled: the first K tokens follow the reference's distribution (chi-square test; too few samples
    fail)."""
    distribution_parity(dflash_pair, dflash_layer_options, dflash_run_cache)


def test_structured_parity(dflash_pair: Pair, dflash_layer_options: LayerOptions) -> None:
    """Under a grammar (json_schema, regex, EBNF): greedy constrained output token-identical to the
    reference's, up to ties; a departure names the token and the grammar."""
    structured_parity(dflash_pair, plain_port=dflash_layer_options.plain_port)
