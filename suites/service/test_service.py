"""Service layer: the unit / process starts, stays up, and serves what the profile says it serves.

Ready means a real greedy AND a real sampled generation succeeded — never `systemctl is-active` (true for a
process seconds before it crashes) or `/v1/models` (answers through minutes of warm-up).

    pytest --host ct200 suites/service
"""

from __future__ import annotations

import pytest

from pytest_dflash.api import (
    ServiceHandle,
    cold_start_within_budgets,
    has_not_restarted,
    health_answers,
    ready_by_real_generation,
    serves_one_consistent_model,
    serves_the_commands_configuration,
    serves_the_profiles_algorithm,
    serves_the_profiles_speculation,
    stays_up,
)

pytestmark = pytest.mark.service


def test_ready_by_real_generation(dflash_service_raw: ServiceHandle) -> None:
    """Ready = a real greedy AND a real sampled (top-k/top-p) generation succeeded."""
    ready_by_real_generation(dflash_service_raw)


def test_cold_start_within_its_budgets(dflash_service: ServiceHandle) -> None:
    """The cold start (process → weights → KV cache → CUDA graphs → port → first greedy → first sampled) stays
    within the [floors.SERVICE] cold-start budgets (cold_start_s, <phase>_s); skipped where none is set."""
    cold_start_within_budgets(dflash_service)


def test_serves_the_profiles_algorithm(dflash_service: ServiceHandle) -> None:
    """/server_info's speculative_algorithm is the profile's algorithm (NONE for a plain server)."""
    serves_the_profiles_algorithm(dflash_service)


def test_serves_the_profiles_speculation(dflash_service: ServiceHandle) -> None:
    """/server_info's speculation (a verdict fact) is what the command asks for (algorithm, draft tokens) and
    the log shows no greedy-verification fallback; other settings SGLang changed quietly become notes."""
    serves_the_profiles_speculation(dflash_service)


def test_serves_the_commands_configuration(dflash_service: ServiceHandle) -> None:
    """/server_info's parsers, grammar backend and parallel sizes (tp, dp, pp, ep) are what the command sets,
    on each such flag it names; without a command they are read from /server_info (the verdict's `served`)."""
    serves_the_commands_configuration(dflash_service)


def test_serves_one_consistent_model(dflash_service: ServiceHandle) -> None:
    """/v1/models, /model_info and /server_info name one model, and it is the profile's `model` when set."""
    serves_one_consistent_model(dflash_service)


def test_has_not_restarted(dflash_service: ServiceHandle) -> None:
    """The unit / process has not died or been restarted since it started (NRestarts = 0)."""
    has_not_restarted(dflash_service)


def test_stays_up(dflash_service: ServiceHandle) -> None:
    """No death or restart in the seconds after readiness (the seed's unit was 'active' 2 s before dying)."""
    stays_up(dflash_service)


def test_health_and_models_answer(dflash_service: ServiceHandle) -> None:
    """/v1/models lists a model; on SGLang's native API /health_generate answers 200."""
    health_answers(dflash_service)
