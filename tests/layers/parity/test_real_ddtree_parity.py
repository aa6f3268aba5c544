"""Parity triage on real DDTREE outputs (H200, the high-acceptance pair; tests/data/sglang-0.5.17-h200-ddtree/):
the lossy-verify fault (run3-lossy: the overlaid verify step accepts the draft's best child unchecked) diverges at
positions where the plain server is confident — real divergences, never ties or noise — while the healthy DDTREE
and DFLASH servers of the same pair are token-identical to plain, in one batch too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.layers.parity.greedy import Candidate, classify

DATA = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h200-ddtree"
TIE_GAP = 0.001  # the parity layer's default, as the device run used it


def metrics(run: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / run / "h200.verdict.json").read_text())["metrics"]
    return data


def test_the_lossy_fault_fails_greedy_parity_with_real_divergences_only() -> None:
    recorded = metrics("run3-lossy")
    for key in ("parity-slice:plain_acc~ddtree_acc_lossy", "parity:plain_acc~ddtree_acc_lossy",
                "parity-concurrent:plain_acc~ddtree_acc_lossy"):
        report = recorded[key]
        assert report["exact"] == 0 and report["real"] == report["prompts"] > 0, key
        assert report["ties"] == report["noise"] == report["unknown"] == 0, key
        assert all(d["kind"] == "real" and d["top12"] > 4 for d in report["divergences"]), key
    # the fault is in the greedy branch of the verify step only: sampled requests keep the target's distribution
    assert recorded["distribution:plain_acc~ddtree_acc_lossy"]["outcome"] == "pass"


def test_classify_names_the_recorded_divergence_real() -> None:
    """'The quick brown fox', token 2: plain chose 358 ' dog', the lossy tree 353 ' fox'. The plain server's top
    logprobs there, as the failure printed them (the first three of five); the fifth follows from the recorded
    gap (5.15625 below the best), the fourth lies between and does not change the outcome."""
    divergence = metrics("run3-lossy")["parity:plain_acc~ddtree_acc_lossy"]["divergences"][0]
    best = -0.473532
    candidates = [Candidate(best, 358), Candidate(-4.91103, 872), Candidate(-5.19228, 690),
                  Candidate(best - divergence["gap"], 1)]
    triage = classify(358, 353, candidates, TIE_GAP)
    assert triage.kind == "real" and triage.lower_bound  # ' fox' is not even in the plain server's top 5
    assert triage.gap == pytest.approx(divergence["gap"])
    assert triage.top12 == pytest.approx(divergence["top12"], abs=1e-5)


@pytest.mark.parametrize(("run", "compared"), [
    ("run3-accept", "dflash_acc"), ("run3-accept", "ddtree_acc"), ("run3-accept", "ddtree_acc_b8"),
    ("run3-configs2", "ddtree_acc_b64"), ("run3-configs2", "dflash_acc_fi"),
    # run 4: the production configurations (CUDA graphs, overlap scheduling, both) and the flashinfer backend
    ("run4-configs-parity", "ddtree_acc_graphs"), ("run4-configs-parity", "ddtree_acc_overlap"),
    ("run4-configs-parity", "ddtree_acc_prod"), ("run4-configs-parity", "dflash_acc_prod"),
    ("run4-fi-parity", "ddtree_acc_fi"), ("run4-accept", "ddtree_acc"), ("run4-accept", "dflash_acc"),
])
def test_healthy_speculative_servers_are_token_identical_to_plain(run: str, compared: str) -> None:
    recorded = metrics(run)
    for kind in ("parity", "parity-concurrent"):
        report = recorded[f"{kind}:plain_acc~{compared}"]
        assert report["exact"] == report["prompts"] == 7 and report["divergences"] == []
    assert recorded[f"distribution:plain_acc~{compared}"]["outcome"] == "pass"
