"""The statistics of distribution parity: the chi-square tail, pooling, the false-alarm rate, power."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pytest_dflash.layers.parity.distribution import (
    MIN_EXPECTED,
    Cell,
    DrawPlan,
    Sample,
    chi2_sf,
    combine,
    homogeneity,
    pool,
)


@pytest.mark.parametrize(("x", "df", "p"), [
    # textbook chi-square quantiles: P(X >= x) = p
    (3.841458820694124, 1, 0.05), (6.634896601021214, 1, 0.01), (10.827566170662733, 1, 0.001),
    (5.991464547107979, 2, 0.05), (18.307038053275146, 10, 0.05), (29.588298445074162, 10, 0.001),
    (124.34211340400407, 100, 0.05), (0.0, 3, 1.0),
])
def test_chi2_tail_matches_tables(x: float, df: int, p: float) -> None:
    assert chi2_sf(x, df) == pytest.approx(p, rel=1e-6, abs=1e-12)


def test_chi2_tail_is_monotone_and_tiny_far_out() -> None:
    values = [chi2_sf(x, 7) for x in range(0, 200, 5)]
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert 0 < chi2_sf(300, 7) < 1e-50


def _markov(rng: np.random.Generator, n: int, first: np.ndarray, flat: bool = True, width: int = 6) -> list[Sample]:
    """n samples of 3 tokens: token 1 from `first`, then each next token uniform over `width` (or deterministic)."""
    t1 = rng.choice(len(first), size=n, p=first)
    if flat:
        rest = rng.integers(0, width, size=(n, 2))
    else:  # greedy continuation: a function of the first token
        rest = np.stack([(t1 * 7) % 6, (t1 * 5) % 6], axis=1)
    return [(int(a), int(b), int(c)) for a, b, c in zip(t1, rest[:, 0], rest[:, 1], strict=True)]


FIRST = np.array([0.3, 0.25, 0.15, 0.1, 0.08, 0.05, 0.04, 0.02, 0.01])


def test_pooling_keeps_every_expected_count_at_five_and_partitions_the_samples() -> None:
    rng = np.random.default_rng(1)
    ref, cmp = _markov(rng, 200, FIRST, width=2), _markov(rng, 150, FIRST, width=2)
    cells = pool(ref, cmp)
    n = len(ref) + len(cmp)
    assert sum(c.reference for c in cells) == len(ref) and sum(c.compared for c in cells) == len(cmp)
    for cell in cells:
        assert cell.total * min(len(ref), len(cmp)) / n >= MIN_EXPECTED - 1e-9, cell
    # disjoint: every sample lands in exactly one cell (its longest matching prefix among the cells)
    prefixes = [c.prefix for c in cells]
    assert len(prefixes) == len(set(prefixes))
    assert any(len(c.prefix) == 3 and c.exact for c in cells) and any(len(c.prefix) < 3 for c in cells)


def test_pooling_of_two_tiny_samples_is_one_cell() -> None:
    cells = pool([(1, 2), (3, 4)], [(5, 6)])
    assert cells == [Cell((), exact=False, reference=2, compared=1)]


def test_same_distribution_false_alarm_rate_is_at_most_alpha() -> None:
    """The documented false-alarm rate, measured: 600 tests of two samples of one law at alpha = 0.05."""
    rng = np.random.default_rng(20261130)
    alarms = sum(homogeneity("p", _markov(rng, 200, FIRST), _markov(rng, 200, FIRST), alpha=0.05).outcome == "fail"
                 for _ in range(600))
    # binomial(600, 0.05): mean 30, sd 5.3; the pooled chi-square is, if anything, conservative
    assert alarms <= 46, f"{alarms} false alarms in 600 tests at alpha 0.05"


def test_greedy_continuation_is_detected() -> None:
    """Same first-token law, later tokens a function of the first (greedy fallback): caught at alpha 1e-3."""
    rng = np.random.default_rng(7)
    result = homogeneity("p", _markov(rng, 200, FIRST), _markov(rng, 200, FIRST, flat=False), alpha=1e-3)
    assert result.outcome == "fail" and result.p_value is not None and result.p_value < 1e-10


def test_a_moderate_shift_is_detected_with_200_samples() -> None:
    """Power at the minimum sample size, at the per-prompt share of the default family alpha (3 prompts):
    0.2 of probability moved between two first tokens is caught at least 3 times in 4 (measured: 0.93;
    0.15 is caught about half the time with 200 samples, 0.97 with 400: docs/generation-parity.md)."""
    rng = np.random.default_rng(3)
    shifted = FIRST.copy()
    shifted[0] -= 0.2
    shifted[3] += 0.2
    caught = sum(combine([("p", _markov(rng, 200, FIRST), _markov(rng, 200, shifted))], alpha=1e-3 / 3,
                         tokens=3, sampling="t").outcome == "fail" for _ in range(40))
    assert caught >= 30, f"power {caught / 40:.2f} < 0.75"


def test_too_few_samples_is_inconclusive_not_pass() -> None:
    rng = np.random.default_rng(5)
    result = homogeneity("p", _markov(rng, 50, FIRST), _markov(rng, 50, FIRST), alpha=1e-3, min_samples=200)
    assert result.outcome == "inconclusive" and "too few samples: need at least 200 per side" in result.describe()


def test_deterministic_first_tokens_are_degenerate_and_alone_inconclusive() -> None:
    result = homogeneity("p", [(1, 2, 3)] * 300, [(1, 2, 3)] * 300, alpha=1e-3)
    assert result.outcome == "degenerate" and "fewer than 2 categories" in result.reason
    samples: list[Sample] = [(1, 2, 3)] * 300
    assert combine([("p", samples, samples)], alpha=1e-3, tokens=3, sampling="t").outcome == "inconclusive"


def test_report_is_bonferroni_over_prompts_and_lengths_and_names_test_and_alpha() -> None:
    rng = np.random.default_rng(9)
    table = [(f"prompt {i}", _markov(rng, 200, FIRST), _markov(rng, 200, FIRST, flat=i != 1)) for i in range(3)]
    report = combine(table, alpha=0.009, tokens=3, sampling="temperature 1")
    assert [r.alpha for r in report.results] == [pytest.approx(0.001)] * 9
    assert [(r.prompt, r.length) for r in report.results if r.outcome == "fail"] == [("prompt 1", 2), ("prompt 1", 3)]
    assert report.outcome == "fail"
    text = report.describe()
    assert "Pearson chi-square test of homogeneity per prompt and prefix length at alpha = 0.001" in text
    assert "family-wise false-alarm rate <= 0.009, Bonferroni over 3 prompts x 3 lengths" in text
    assert "'prompt 1', first 2 tokens: FAIL: Pearson chi-square X2 = " in text
    assert "largest differences:" in text
    assert "'prompt 0': 3 length(s) pass, smallest p = " in text


def test_a_degenerate_prompt_beside_a_tested_one_passes_and_says_so() -> None:
    rng = np.random.default_rng(11)
    constant: list[Sample] = [(1, 2, 3)] * 200
    table = [("a", _markov(rng, 200, FIRST), _markov(rng, 200, FIRST)), ("b", constant, constant)]
    report = combine(table, alpha=1e-3, tokens=3, sampling="temperature 1")
    assert report.outcome == "pass"
    assert "'b': lengths [1, 2, 3] degenerate" in report.describe()


def test_too_few_samples_on_one_prompt_makes_the_report_inconclusive() -> None:
    rng = np.random.default_rng(12)
    table = [("a", _markov(rng, 200, FIRST), _markov(rng, 200, FIRST)),
             ("b", _markov(rng, 20, FIRST), _markov(rng, 20, FIRST))]
    report = combine(table, alpha=1e-3, tokens=3, sampling="temperature 1")
    assert report.outcome == "inconclusive"
    assert "'b', first 1 token: INCONCLUSIVE (too few samples: need at least 200 per side" in report.describe()


def test_draw_plan_renders_a_sampled_request() -> None:
    plan = DrawPlan(count=10, tokens=3, temperature=0.7, top_k=40)
    sampling = plan.sampling()
    assert (sampling.max_tokens, sampling.temperature, sampling.top_k, sampling.ignore_eos) == (3, 0.7, 40, True)
    assert plan.describe() == "temperature 0.7, top_k 40"
