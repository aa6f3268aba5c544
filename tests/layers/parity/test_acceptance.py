"""Accept length per request from recorded DFLASH meta_info, the /server_info fallback, DDTREE vs DFLASH."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_dflash.client import InferenceClient
from pytest_dflash.layers.parity.acceptance import (
    Acceptance,
    AcceptanceUnavailable,
    check_at_least_one,
    check_ddtree_vs_dflash,
    measure,
)


def test_per_request_accept_length_is_sglangs(recorded: dict[str, Any],
                                              replay: Callable[..., InferenceClient]) -> None:
    body = recorded["dflash_graph/generate_greedy_2"]["body_json"]
    meta = body["meta_info"]
    result = measure(replay(lambda _: (200, body)), ["a", "b", "c"], max_tokens=32)
    assert result.source == "meta_info" and result.per_request == [meta["spec_accept_length"]] * 3
    assert (result.tokens, result.steps) == (3 * meta["completion_tokens"], 3 * meta["spec_verify_ct"])
    assert result.mean == pytest.approx(1.032, abs=1e-3)  # the H200 record: random draft, 32 tokens in 31 steps
    check_at_least_one(result)


def test_without_per_request_fields_the_server_average_after_a_flush_is_used(
        recorded: dict[str, Any], replay: Callable[..., InferenceClient]) -> None:
    body = recorded["dflash_graph/generate_greedy_2"]["body_json"]
    old = {**body, "meta_info": {k: v for k, v in body["meta_info"].items() if not k.startswith("spec_")}}
    flushes: Iterator[tuple[int, Any]] = iter([(400, "Cache not flushed: requests running"),
                                               (200, "Cache flushed.\nPlease check backend logs for more details.")])
    client = replay(lambda _: (200, old), routes={
        "/flush_cache": lambda: next(flushes),
        "/server_info": lambda: (200, {"internal_states": [{"avg_spec_accept_length": 2.75}]}),
    })
    result = measure(client, ["a", "b"], max_tokens=32)
    assert (result.source, result.mean, result.tokens) == ("server_info", 2.75, 64)


def test_no_accept_length_anywhere_is_named(replay: Callable[..., InferenceClient], recorded: dict[str, Any]) -> None:
    plain = recorded["plain/generate_greedy_1"]["body_json"]
    client = replay(lambda _: (200, plain), routes={"/flush_cache": lambda: (200, "Cache flushed."),
                                                    "/server_info": lambda: (200, {"internal_states": [{}]})})
    with pytest.raises(AcceptanceUnavailable, match="no accept length: meta_info has no spec_verify_ct"):
        measure(client, ["a"], max_tokens=32)


def test_ddtree_below_dflash_fails_with_both_numbers() -> None:
    ddtree = Acceptance("local/ddtree", "meta_info", 2, tokens=128, steps=32, per_request=[4.0, 4.0])
    dflash = Acceptance("local/dflash", "meta_info", 2, tokens=128, steps=30, per_request=[4.57, 4.0])
    with pytest.raises(AssertionError, match=r"local/ddtree 4.000 vs local/dflash 4.267 tokens per verify step "
                                             r"\(ratio 0.938\)"):
        check_ddtree_vs_dflash(ddtree, dflash, ratio=1.0)
    check_ddtree_vs_dflash(ddtree, dflash, ratio=0.9)
