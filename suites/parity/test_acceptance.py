"""Acceptance: how many tokens each speculative service emits per verify step, and DDTREE vs DFLASH.

    pytest --host local suites/parity -m perf
    pytest --host ct200 suites/parity --ddtree-accept-ratio 1.1

Accept length is speed, not correctness: these tests are in the perf layer. The numbers go into the
terminal summary and the verdict (services.<name>.accept_length, metrics."acceptance:<name>").
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_dflash.api import LayerOptions, ServiceHandle, accept_length, ddtree_accepts_at_least_dflash

pytestmark = pytest.mark.perf


@pytest.mark.dflash_services(speculative=True)
def test_accept_length(dflash_service: ServiceHandle, dflash_layer_options: LayerOptions,
                       dflash_run_cache: dict[tuple[str, ...], Any]) -> None:
    """Per-request accept length from meta_info (else /server_info after /flush_cache) on everyday prompts;
    >= 1.

    The /flush_cache goes to a server this run did not start only with --allow-state-changes (else:
    skipped)."""
    accept_length(dflash_service, dflash_layer_options, dflash_run_cache)


@pytest.mark.dflash_services(algorithms=("DDTREE",))
def test_ddtree_accepts_at_least_dflash(dflash_service: ServiceHandle, dflash_layer_options: LayerOptions,
                                        dflash_run_cache: dict[tuple[str, ...], Any],
                                        request: pytest.FixtureRequest) -> None:
    """DDTREE's mean accept length >= ratio x DFLASH's on the same prompts (--ddtree-accept-ratio,
    default 1)."""
    ddtree_accepts_at_least_dflash(dflash_service, dflash_layer_options, dflash_run_cache,
                                                 request.node)
