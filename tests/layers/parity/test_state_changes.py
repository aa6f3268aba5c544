"""Attach is read-only: /flush_cache goes only to servers this run started, or with --allow-state-changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.loader import attach_profile
from pytest_dflash.layers.parity.acceptance import Acceptance, FlushRefused, check_floor, measure
from pytest_dflash.layers.parity.hooks import OPTIONS_KEY, state_change_refusal
from pytest_dflash.run.handle import ServiceHandle
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun


def _attached() -> ServiceHandle:
    profile = attach_profile("http://127.0.0.1:30000")
    return DflashRun({profile.name: profile}, RunOptions(), "r1").host(profile.name).service("attached")


def test_an_attached_server_may_not_be_flushed_unless_allowed() -> None:
    handle = _attached()
    refusal = state_change_refusal(handle, allowed=False)
    assert refusal is not None and "was not started by this run (attach mode)" in refusal
    assert "--allow-state-changes (ini dflash_allow_state_changes = true)" in refusal
    assert state_change_refusal(handle, allowed=True) is None


def test_the_server_info_fallback_refuses_before_sending_a_flush(recorded: dict[str, Any],
                                                                replay: Callable[..., InferenceClient]) -> None:
    body = recorded["dflash_graph/generate_greedy_2"]["body_json"]
    old = {**body, "meta_info": {k: v for k, v in body["meta_info"].items() if not k.startswith("spec_")}}
    flushed: list[str] = []

    def flush() -> tuple[int, str]:
        flushed.append("POST /flush_cache")
        return 200, "Cache flushed."

    client = replay(lambda _: (200, old), routes={
        "/flush_cache": flush,
        "/server_info": lambda: (200, {"internal_states": [{"avg_spec_accept_length": 2.75}]}),
    })
    with pytest.raises(FlushRefused, match="the server-wide average needs a /flush_cache first: attached"):
        measure(client, ["a", "b"], max_tokens=32, flush_refused="attached")
    assert flushed == []
    assert measure(client, ["a", "b"], max_tokens=32).mean == 2.75 and flushed == ["POST /flush_cache"]


def test_per_request_accept_length_needs_no_flush(recorded: dict[str, Any],
                                                  replay: Callable[..., InferenceClient]) -> None:
    body = recorded["dflash_graph/generate_greedy_2"]["body_json"]
    client = replay(lambda _: (200, body), routes={"/flush_cache": lambda: pytest.fail("flushed")})
    assert measure(client, ["a"], max_tokens=32, flush_refused="attached").source == "meta_info"


def test_allow_state_changes_flag_and_ini_key(pytester: pytest.Pytester) -> None:
    assert pytester.parseconfigure().stash[OPTIONS_KEY].allow_state_changes is False
    assert pytester.parseconfigure("--allow-state-changes").stash[OPTIONS_KEY].allow_state_changes is True
    pytester.makeini("[pytest]\ndflash_allow_state_changes = true\n")
    assert pytester.parseconfigure().stash[OPTIONS_KEY].allow_state_changes is True


def test_accept_length_below_the_profiles_floor_fails_with_the_number() -> None:
    result = Acceptance("local/dflash", "meta_info", 3, tokens=192, steps=64, per_request=[3.2, 2.9, 2.9])
    with pytest.raises(AssertionError, match=r"local/dflash: accept length 3.000 < floor 3.5 \(\[floors.dflash\] "
                                             r"accept_length\) on 3 greedy prompts \(meta_info; 192 tokens in 64 "
                                             r"verify steps\); per request \[3.2, 2.9, 2.9\]"):
        check_floor(result, 3.5, where="[floors.dflash] accept_length")
    check_floor(result, 3.0)
    check_floor(result, None)  # no floor: at least one token per verify step
    with pytest.raises(AssertionError, match="< 1"):
        check_floor(Acceptance("x", "meta_info", 1, tokens=10, steps=20), None)
