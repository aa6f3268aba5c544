"""--gpu-token-us: a scheduler iteration over a batch costs more the more tokens it verifies (batch × tokens per
sequence), so speculation's advantage falls with concurrency and a crossover exists on CPU; it moves with
--speculative-num-draft-tokens and the step costs. The refserver batches concurrent requests into one
iteration, so the cost is charged once per iteration over the running batch."""

from __future__ import annotations

import pytest

from pytest_dflash.load.run import run_load
from pytest_dflash.load.spec import LoadSpec
from pytest_dflash.refserver.cost_model import gpu_token_seconds, verified_tokens
from pytest_dflash.refserver.launch import RefServerProcess


@pytest.mark.parametrize(("algorithm", "block", "budget", "tokens"), [
    ("NONE", 8, 32, 1), ("DFLASH", 8, 32, 8), ("DFLASH", 4, 32, 4), ("NGRAM", 6, 32, 6), ("DDTREE", 8, 32, 33),
    ("DDTREE", 8, 12, 13)])
def test_tokens_a_pass_verifies_per_sequence(algorithm: str, block: int, budget: int, tokens: int) -> None:
    assert verified_tokens(algorithm, block, budget) == tokens
    assert gpu_token_seconds(500, algorithm, block, budget) == pytest.approx(tokens * 500e-6)
    assert gpu_token_seconds(0, algorithm, block, budget) == 0.0  # the default: today's flat cost


def _tok_s(server: RefServerProcess, concurrency: int) -> float:
    spec = LoadSpec(endpoint="generate", concurrency=concurrency, num_requests=2 * concurrency,
                    warmup_requests=concurrency, prompt_len=8, output_len=8, max_loop_lag_ms=500,
                    max_client_cpu=1.0)
    result = run_load(server.url, spec)
    assert not result.metrics["failed"]
    return float(result.metrics["output_throughput"])


def _speedups(token_us: str, block: str, step_ms: str = "8") -> tuple[float, float]:
    """(speed-up at concurrency 1, at concurrency 8) of DFLASH over NONE under one cost model."""
    cost = ("--gpu-step-ms", step_ms, "--gpu-token-us", token_us)
    with RefServerProcess(*cost) as none, RefServerProcess(
            *cost, "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", block) as dflash:
        return _tok_s(dflash, 1) / _tok_s(none, 1), _tok_s(dflash, 8) / _tok_s(none, 8)


def test_the_crossover_exists_and_moves_with_the_draft_tokens_and_the_step_cost() -> None:
    # 16 ms steps, 2.4 ms per verified token: at concurrency 1 the draft pays (~3 tokens per pass of 8, 37 ms
    # vs 18 ms); at 8 a DFLASH pass verifies 64 tokens (~172 ms) for ~24 committed, NONE its 8 (~35 ms) for 8.
    # The floors are twice what the refserver docs' example uses: on a loaded CI machine a NONE pass of 8 ms +
    # 8 × 1.2 ms was stretched by the CPU's own work and scheduling (DFLASH then read 0.67x instead of ~0.45x),
    # and every ratio below is measured against that baseline (docs/refserver.md, "The crossover on CPU").
    low, high = _speedups("2400", "8", step_ms="16")
    assert low > 1.2, (low, high)
    assert high < 0.8, (low, high)
    # a smaller block verifies fewer tokens per pass: speculation still pays better at 8 (the crossover moved
    # up). By the cost model ~1.8x the block-8 speed-up; 1.2x stays clear of the 1.0x a broken model gives.
    _, high_small = _speedups("2400", "3", step_ms="16")
    assert high_small > high * 1.2, (high, high_small)
    # a dearer fixed step (a bigger model, memory-bound for longer) hides more of the token cost: up it goes
    # (~1.7x by the cost model)
    _, high_slow_step = _speedups("2400", "8", step_ms="64")
    assert high_slow_step > high * 1.2, (high, high_slow_step)


def test_one_iteration_serves_the_whole_batch() -> None:
    # without a token cost a pass costs the same for 1 or 8 sequences: 8 streams get ~8x the tokens/s
    with RefServerProcess("--gpu-step-ms", "20") as none:
        one, eight = _tok_s(none, 1), _tok_s(none, 8)
    assert eight > 5 * one, (one, eight)
