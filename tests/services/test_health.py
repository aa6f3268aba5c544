"""What SGLang's health routes can be trusted to say (services/health.py), by the rules read from the wheels:
SGLANG_DIAG_BYPASS_HEALTH_GENERATE parsed as SGLang's EnvBool parses it (0.5.19 `sglang/srt/environ.py:143`),
GET /ready from 0.5.20 on, GET /ping telling health from 0.5.23 on. The routes themselves are asked of real
refservers in test_engine_progress.py and test_readiness_http.py."""

from __future__ import annotations

import pytest

from pytest_dflash.services.health import BYPASS_ENV, ReadyAnswer, has_ready_route, health_bypass, release


@pytest.mark.parametrize(("value", "bypassed"), [
    ("1", True), ("true", True), ("True", True), ("YES", True), ("y", True),
    ("0", False), ("false", False), ("no", False), ("", False), ("on", False), (" 1", False),  # EnvBool: no strip
])
def test_the_bypass_is_on_exactly_when_sglangs_envbool_reads_true(value: str, bypassed: bool) -> None:
    why = health_bypass({BYPASS_ENV: value}, where="the profile's env of h/dflash")
    assert (why is not None) is bypassed
    if why:
        assert why == (f"SGLANG_DIAG_BYPASS_HEALTH_GENERATE={value} in the profile's env of h/dflash: SGLang "
                       "0.5.19+ then answers /health and /health_generate 200 without a generation")
    assert health_bypass({}, where="x") is None


@pytest.mark.parametrize(("version", "ready"), [
    ("0.5.17", False), ("0.5.19", False), ("0.5.20", True), ("0.5.23", True), ("0.5.20.post1", True),
    ("0.6.0rc1", True), (None, True), ("unknown", True),  # not known: asked (a 404 says there is none)
])
def test_ready_is_asked_from_0_5_20_or_when_the_release_is_unknown(version: str | None, ready: bool) -> None:
    assert has_ready_route(version) is ready


def test_release_reads_the_leading_numbers() -> None:
    assert release("0.5.21rc0") == (0, 5, 21) and release("") is None and release(None) is None


def test_each_ready_answer_says_what_it_means() -> None:
    assert ReadyAnswer(200).describe().startswith("GET /ready: 200 (up, healthy and not paused")
    assert ReadyAnswer(503, 200, paused=True).describe().startswith("GET /ready: 503 while GET /ping: 200 "
                                                                   "(SGLang 0.5.23+: paused, by POST /pause_")
    assert ReadyAnswer(503).describe() == ("GET /ready: 503 (not taking new requests: paused by POST "
                                           "/pause_generation, shutting down, or marked unhealthy by a failed "
                                           "health check)")
    assert "GET /ping: 503 (not healthy" in ReadyAnswer(503, 503).describe()
    assert ReadyAnswer(None, error="timed out").describe() == "GET /ready: no answer (timed out)"
    assert ReadyAnswer(503).not_ready and not ReadyAnswer(200).not_ready
