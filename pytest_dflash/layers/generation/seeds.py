"""Greedy-fallback detection: one prompt sampled at temperature 1 with many seeds, and what its outputs say.

A verifier that falls back to greedy argmax samples the first token only; every later token is the greedy
continuation. SGLang says so once in its log (GREEDY_FALLBACK_LINE), which the failure quotes when it
is there.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.errors import DflashError
from pytest_dflash.layers.generation.requests import PATHS, Api, generate_batch, request
from pytest_dflash.layers.generation.shapes import fail

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

# Open-ended, so that a correctly sampled continuation varies from seed to seed on any model.
SEED_PROMPT = "Here is a random sequence of numbers between 0 and 999, separated by commas:"

# SGLang logs this once at start-up when sgl_kernel lacks tree_speculative_sampling_target_only.
GREEDY_FALLBACK_LINE = re.compile(r"[^\n]*falling back to greedy argmax verification[^\n]*")


@dataclass
class SeedVariation:
    """Outputs of one prompt at temperature 1 with different seeds."""

    seeds: list[int]
    texts: list[str]
    ids: list[tuple[int, ...]] | None  # native only

    @property
    def outputs(self) -> list[tuple[int, ...]] | list[str]:
        return self.ids if self.ids is not None else self.texts

    @property
    def distinct(self) -> int:
        return len(set(self.outputs))

    def identical_pairs(self) -> int:
        """Pairs of samples (different seeds) that are identical throughout."""
        counts: dict[object, int] = {}
        for output in self.outputs:
            counts[output] = counts.get(output, 0) + 1
        return sum(n * (n - 1) // 2 for n in counts.values())

    def same_first_token_pairs(self) -> tuple[int, int]:
        """Native only: (pairs of samples sharing their first token, how many of those are identical
        throughout)."""
        if self.ids is None:
            return 0, 0
        groups: dict[int, list[tuple[int, ...]]] = {}
        for ids in self.ids:
            if ids:
                groups.setdefault(ids[0], []).append(ids)
        pairs = identical = 0
        for members in groups.values():
            for i in range(len(members)):
                for j in range(i + 1, len(members)):
                    pairs += 1
                    identical += members[i] == members[j]
        return pairs, identical


def sample_seeds(client: InferenceClient, api: Api, *, count: int | None = None, max_tokens: int = 24,
                 base_seed: int = 500, timeout_s: float | None = None) -> SeedVariation:
    """Samples of SEED_PROMPT at temperature 1, each with its own seed.

    Natively 32 in one batched request (token ids); otherwise 16 concurrent requests (text only).
    """
    count = count or (32 if api == "generate" else 16)
    seeds = [base_seed + i for i in range(count)]
    sampling = Sampling(max_tokens=max_tokens, temperature=1.0, ignore_eos=True)
    if api == "generate":
        batch = generate_batch(client, [SEED_PROMPT] * count, [replace(sampling, seed=s) for s in seeds],
                               timeout_s=timeout_s)
        return SeedVariation(seeds, [g.text for g in batch], [tuple(g.output_ids or ()) for g in batch])

    def one(seed: int) -> str:
        # the whole output: under a reasoning parser a chat's sampled text is (mostly) reasoning_content
        return request(client, api, SEED_PROMPT, replace(sampling, seed=seed), timeout_s=timeout_s)[0].output

    with concurrent.futures.ThreadPoolExecutor(max_workers=count, thread_name_prefix="dflash-seeds") as pool:
        texts = list(pool.map(one, seeds))
    return SeedVariation(seeds, texts, None)


def service_log_line(handle: ServiceHandle, pattern: re.Pattern[str], *, lines: int = 20000) -> str | None:
    """The first line of the service's log (since this run started it, or its recent journal) matching
    pattern."""
    try:
        log = handle.manager.logs_since(handle.started_mark, lines)
    except DflashError:
        return None
    match = pattern.search(log)
    return match.group(0).strip() if match else None


def check_seed_variation(variation: SeedVariation, *, api: Api, log_line: Callable[[], str | None]) -> None:
    """Fail when seeds do not change the output (greedy fallback), naming SGLang's log line when present.

    Failing patterns: all samples identical; (native) at least 3 pairs of samples share their first token
    and every such pair is identical after it; (text only) at least 3 pairs of samples are identical
    throughout. A correctly sampled 24-token run of random numbers practically never repeats.
    """
    __tracebackhide__ = True
    count = len(variation.seeds)
    where = f"temperature 1, seeds {variation.seeds[0]}..{variation.seeds[-1]}, {PATHS[api]}"
    problem = None
    if variation.distinct == 1:
        problem = f"all {count} samples ({where}) are identical: {variation.texts[0][:60]!r}"
    elif variation.ids is not None:
        pairs, identical = variation.same_first_token_pairs()
        if pairs >= 3 and identical == pairs:
            problem = (f"{pairs} pairs of samples ({where}) share their first token and every such pair is "
                       f"identical after it ({variation.distinct} distinct outputs of {count}): only the "
                       "first token is sampled, every later token is the greedy continuation")
    elif (identical := variation.identical_pairs()) >= 3:
        problem = (f"{identical} pairs of samples ({where}) are identical throughout ({variation.distinct} "
                   f"distinct outputs of {count}): later tokens are not sampled")
    if problem is None:
        return
    line = log_line()
    if line:
        fail(f"greedy fallback: {problem}.\nThe server log says: {line}")
    fail(f"sampling is not sampling: {problem}. SGLang's greedy-fallback warning is not in the service log "
          "(it may have left the journal); check the speculative verifier's sampling path")


__all__ = [
    "GREEDY_FALLBACK_LINE",
    "SEED_PROMPT",
    "SeedVariation",
    "check_seed_variation",
    "sample_seeds",
    "service_log_line",
]
