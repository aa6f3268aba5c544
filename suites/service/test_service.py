"""Service layer: the unit / process starts, stays up, and serves what the profile says it serves.

Ready means a real greedy AND a real sampled generation succeeded — never `systemctl is-active` (true for a
process seconds before it crashes) or `/v1/models` (answers through minutes of warm-up).

    pytest --host ct200 suites/service
"""

from __future__ import annotations

import time

import pytest

from pytest_dflash.run.state import ServiceHandle

pytestmark = pytest.mark.service
STAY_UP_S = 2.0  # the seed's service was "active" 2-3 s before it died


def test_ready_by_real_generation(dflash_service_raw: ServiceHandle) -> None:
    report = dflash_service_raw.ensure_ready()
    assert report.greedy_s is not None and report.sampled_s is not None


def test_serves_the_profiles_algorithm(dflash_service: ServiceHandle) -> None:
    if not dflash_service.native or dflash_service.spec.kind == "external":
        pytest.skip("needs SGLang's /server_info and a profile that names the algorithm")
    served = str((dflash_service.server_info or {}).get("speculative_algorithm") or "NONE").upper()
    assert served == dflash_service.spec.algorithm, (
        f"{dflash_service.label}: the profile says {dflash_service.spec.algorithm}, the server runs {served} "
        f"(server_info speculative_algorithm); check the unit's --speculative-algorithm")


def test_has_not_restarted(dflash_service: ServiceHandle) -> None:
    if not dflash_service.host.has_host_access:
        pytest.skip("attached by URL: no unit to inspect")
    state = dflash_service.manager.state()
    assert state.death is None, f"{dflash_service.label}: {state.summary()}"
    assert state.restarts == 0, (
        f"{dflash_service.label}: NRestarts={state.restarts}: it crashed and was restarted since it started "
        "(Restart= hides crash loops from is-active); the journal shows the earlier crash")


def test_stays_up(dflash_service: ServiceHandle) -> None:
    """No death or restart in the seconds after readiness (the seed's unit was 'active' 2 s before dying)."""
    deadline = time.monotonic() + STAY_UP_S
    while time.monotonic() < deadline:
        problem = dflash_service.check_alive()
        assert problem is None, str(problem)
        time.sleep(0.25)


def test_health_and_models_answer(dflash_service: ServiceHandle) -> None:
    client = dflash_service.client
    models = client.models()
    assert models, f"{dflash_service.label}: /v1/models lists no model"
    if dflash_service.spec.model is not None:
        assert dflash_service.spec.model in models, f"profile model {dflash_service.spec.model!r} not in {models}"
    if dflash_service.native:
        status = client.health_generate(timeout_s=30)
        assert status == 200, f"{dflash_service.label}: /health_generate answered {status} after readiness"
