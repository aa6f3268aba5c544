"""The refserver's DDTREE /generate answers have the real ddtree-v2 port's shape and accounting (recorded on the
H200 with the high-acceptance pair: tests/data/sglang-0.5.17-h200-ddtree/run3-fi-warm/probe_ddtree_flashinfer.json,
block 16, budget 32): the same meta_info fields in the same order, `spec_proposed_drafts` = verify steps x
(block - 1) whatever the tree budget, `spec_accept_rate` = correct / proposed, and return_logprob refused with the
DFlash family's text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from refserver_helpers import assert_same_shape, post

from pytest_dflash.refserver.launch import RefServerProcess

PROBE = (Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-ddtree" / "run3-fi-warm"
         / "probe_ddtree_flashinfer.json")
SEED_TO_LENGTH = 1  # the refserver's sampled answer to the recorded prompt runs to max_new_tokens, as recorded


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    probes = json.loads(PROBE.read_text())["probes"]
    return {p["name"]: p for p in probes}


def test_the_recording_shows_the_block_based_accounting(real: dict[str, Any]) -> None:
    meta = real["greedy"]["response"]["meta_info"]
    assert real["server_info"]["response"]["speculative_ddtree_budget"] == 32
    block = real["server_info"]["response"]["speculative_num_draft_tokens"]
    assert meta["spec_proposed_drafts"] == meta["spec_verify_ct"] * (block - 1) == 150  # not x budget (32)


@pytest.mark.parametrize("probe", ["greedy", "sampled"])
def test_generate_meta_info_matches_the_real_port(ddtree_server: RefServerProcess, real: dict[str, Any],
                                                  probe: str) -> None:
    recorded = real[probe]
    request = recorded["body"]
    if probe == "sampled":  # seeded: unseeded, 1 request in 20 samples a stop token ('stop' has other keys)
        request = {**request, "sampling_params": {**request["sampling_params"], "sampling_seed": SEED_TO_LENGTH}}
    body = post(ddtree_server, "/generate", request).json()
    assert_same_shape(body, recorded["response"])
    meta = body["meta_info"]
    block = httpx.get(ddtree_server.url + "/server_info", timeout=10).json()["speculative_num_draft_tokens"]
    assert meta["spec_proposed_drafts"] == meta["spec_verify_ct"] * (block - 1)  # the refserver's budget is 24
    assert meta["spec_num_proposed_drafts"] == meta["spec_proposed_drafts"]
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / meta["spec_proposed_drafts"])


def test_return_logprob_is_refused_with_the_real_text(ddtree_server: RefServerProcess, real: dict[str, Any]) -> None:
    recorded = real["logprob"]
    response = post(ddtree_server, "/generate", recorded["body"])
    assert response.status_code == recorded["status"] == 400
    assert response.json() == recorded["response"]
