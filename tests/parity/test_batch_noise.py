"""Concurrent parity on a real H200: a divergence one bf16 step from the top, only inside a batch, is noise."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_dflash.parity import Candidate, Divergence, batch_noise, classify

RUN = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200" / "suite-runs" / "run2-pytest.log"
# The plain server's greedy ids for "The quick brown fox" (recorded: results_plain.json, generate_greedy_1).
REFERENCE = (929, 364, 772, 295, 490, 758, 991, 626, 427, 970, 60, 33, 766, 757, 963, 88, 498, 64, 155, 366,
             425, 58, 434, 948, 62, 39, 906, 180, 273, 66, 431, 725)


def recorded_candidates() -> tuple[Candidate, ...]:
    line = next(line for line in RUN.read_text().splitlines() if "plain server's top logprobs there:" in line)
    pairs = re.findall(r"(\d+) (?:'[^']*'|\"[^\"]*\"): (-?\d+\.\d+)", line.split("top logprobs there:")[1])
    return tuple(Candidate(float(lp), int(tok)) for tok, lp in pairs)


def divergence(gap_source: tuple[Candidate, ...]) -> Divergence:
    compared = (*REFERENCE[:30], 10, 12, 839)
    verdict = classify(431, 10, gap_source, tie_gap=0.001)
    return Divergence("The quick brown fox", 30, REFERENCE, compared, verdict.gap, verdict.kind, verdict.top12,
                      verdict.candidates)


def test_the_recorded_divergence_is_real_by_the_tie_rule_alone() -> None:
    candidates = recorded_candidates()
    assert [c.token for c in candidates] == [431, 10, 647]
    d = divergence(candidates)
    assert d.kind == "real" and d.gap is not None and abs(d.gap - 0.25) < 1e-9


def test_it_is_batch_noise_when_the_service_matches_alone() -> None:
    d = batch_noise(divergence(recorded_candidates()), REFERENCE, batch_gap=0.5)
    assert d.kind == "batch" and "sent alone" in d.note


def test_it_stays_real_when_the_service_diverges_alone_too_or_the_gap_is_large() -> None:
    candidates = recorded_candidates()
    alone_wrong = (*REFERENCE[:30], 10, 12, 839)
    assert batch_noise(divergence(candidates), alone_wrong, batch_gap=0.5).kind == "real"
    assert batch_noise(divergence(candidates), REFERENCE, batch_gap=0.1).kind == "real"
    confident = (Candidate(-0.01, 431), Candidate(-5.0, 10))  # a batching bug picks a token 5 nats down
    assert batch_noise(divergence(confident), REFERENCE, batch_gap=0.5).kind == "real"
    assert batch_noise(divergence(candidates), None, batch_gap=0.5).kind == "real"  # no single-request run
