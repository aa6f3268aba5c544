"""A near-tie divergence on a real H200 that the service itself does not repeat is numerical noise, not a bug."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_dflash.layers.parity.greedy import Candidate, Divergence, classify, numerical_noise

RUNS = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h200" / "suite-runs"
# The plain server's greedy ids for "The quick brown fox" (recorded: results_plain.json, generate_greedy_1);
# DFLASH's first request for it ended …66, 10, 12 and its repeats …66, 431, 725 (results_dflash_nograph.json).
REFERENCE = (929, 364, 772, 295, 490, 758, 991, 626, 427, 970, 60, 33, 766, 757, 963, 88, 498, 64, 155, 366,
             425, 58, 434, 948, 62, 39, 906, 180, 273, 66, 431, 725)
DIVERGED = (*REFERENCE[:30], 10, 12)


def recorded_candidates(run: str) -> tuple[Candidate, ...]:
    text = (RUNS / f"{run}-pytest.log").read_text()
    line = next(line for line in text.splitlines() if "plain server's top logprobs there:" in line)
    pairs = re.findall(r"(\d+) (?:'[^']*'|\"[^\"]*\"): (-?\d+\.\d+)", line.split("top logprobs there:")[1])
    return tuple(Candidate(float(lp), int(tok)) for tok, lp in pairs)


def divergence(candidates: tuple[Candidate, ...]) -> Divergence:
    verdict = classify(431, 10, candidates, tie_gap=0.001)
    return Divergence("The quick brown fox", 30, REFERENCE, DIVERGED, verdict.gap, verdict.kind, verdict.top12,
                      verdict.candidates)


@pytest.mark.parametrize("run", ["run2", "run3"])  # run2: inside a concurrent batch; run3: a first request
def test_the_recorded_divergence_is_one_bf16_step_and_real_by_the_tie_rule(run: str) -> None:
    candidates = recorded_candidates(run)
    assert [c.token for c in candidates] == [431, 10, 647]
    assert [c.logprob for c in candidates] == [-1.09125, -1.34125, -1.59125]
    d = divergence(candidates)
    assert d.kind == "real" and d.gap is not None and abs(d.gap - 0.25) < 1e-9


def test_it_is_noise_when_the_service_gives_the_reference_token_again() -> None:
    d = numerical_noise(divergence(recorded_candidates("run3")), REFERENCE, noise_gap=0.5)
    assert d.kind == "noise" and "sent again alone" in d.note


def test_it_stays_real_when_repeated_or_too_far_from_the_top() -> None:
    candidates = recorded_candidates("run3")
    assert numerical_noise(divergence(candidates), DIVERGED, noise_gap=0.5).kind == "real"  # a lossy verifier repeats
    assert numerical_noise(divergence(candidates), REFERENCE, noise_gap=0.1).kind == "real"
    confident = (Candidate(-0.01, 431), Candidate(-5.0, 10))  # a batching bug: a token 5 nats down
    assert numerical_noise(divergence(confident), REFERENCE, noise_gap=0.5).kind == "real"
    assert numerical_noise(divergence(candidates), None, noise_gap=0.5).kind == "real"
    assert numerical_noise(divergence(candidates), REFERENCE[:20], noise_gap=0.5).kind == "real"  # too short to tell
