"""Parity: is speculative decoding lossless? Token-level comparison of greedy outputs.

Ties are real (a random-weight model on an H200 had two tokens at logprob -1.6786701679229736), so a
divergence is triaged with the reference's top logprobs at the first differing position: a top-1 /
top-2 gap below `tie_gap` is a numerical tie, anything larger is a real divergence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .client import Generation, InferenceClient, Sampling

if TYPE_CHECKING:
    from .host import ServiceHandle

SMOKE_PROMPTS = (
    "The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time there was a small model that learned to write stories about",
)


@dataclass(frozen=True)
class Divergence:
    prompt: str
    index: int  # first differing output position
    reference_ids: tuple[int, ...]
    compared_ids: tuple[int, ...]
    gap: float | None = None  # top-1 minus top-2 logprob of the reference at `index`, when known
    kind: str = "unknown"  # "tie" | "real" | "unknown" (no logprobs to triage with)

    def describe(self) -> str:
        ref = list(self.reference_ids[max(0, self.index - 3) : self.index + 3])
        cmp = list(self.compared_ids[max(0, self.index - 3) : self.index + 3])
        gap = f", top-1/top-2 gap {self.gap:.3g}" if self.gap is not None else ""
        return (f"{self.prompt[:40]!r}: diverges at token {self.index} ({self.kind}{gap}): "
                f"reference …{ref}… vs compared …{cmp}…")


@dataclass
class ParityReport:
    prompts: int = 0
    exact: int = 0
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def exact_rate(self) -> float:
        return self.exact / self.prompts if self.prompts else 0.0

    @property
    def real(self) -> list[Divergence]:
        return [d for d in self.divergences if d.kind != "tie"]

    @property
    def ties(self) -> list[Divergence]:
        return [d for d in self.divergences if d.kind == "tie"]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, or None when equal (a strict prefix counts as differing)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(gap: float | None, tie_gap: float) -> str:
    if gap is None:
        return "unknown"
    return "tie" if gap <= tie_gap else "real"


def top_gap(plain: InferenceClient, prompt: str, prefix: Sequence[int]) -> float | None:
    """top-1 minus top-2 logprob of a non-speculative server at position len(prefix) after `prompt`.

    Valid only if the plain server's own greedy output starts with `prefix`; otherwise None.
    """
    gen = plain.generate(prompt, Sampling(max_tokens=len(prefix) + 1, temperature=0.0, ignore_eos=True),
                         return_logprob=True, top_logprobs_num=2)
    if gen.output_ids is None or tuple(gen.output_ids[: len(prefix)]) != tuple(prefix):
        return None
    if not gen.top_logprobs or len(gen.top_logprobs) <= len(prefix):
        return None
    step = sorted((lp for lp, _ in gen.top_logprobs[len(prefix)]), reverse=True)
    return step[0] - step[1] if len(step) >= 2 else None


def compare_greedy(
    reference: InferenceClient,
    compared: InferenceClient,
    prompts: Sequence[str],
    *,
    max_tokens: int = 32,
    plain: InferenceClient | None = None,
    tie_gap: float = 1e-3,
) -> ParityReport:
    """Greedy token ids of `compared` vs `reference` on each prompt, ties triaged through `plain`."""
    report = ParityReport()
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        ref: Generation = reference.generate(prompt, sampling)
        cmp: Generation = compared.generate(prompt, sampling)
        report.prompts += 1
        ref_ids, cmp_ids = tuple(ref.output_ids or ()), tuple(cmp.output_ids or ())
        index = first_divergence(ref_ids, cmp_ids)
        if index is None:
            report.exact += 1
            continue
        gap = top_gap(plain, prompt, ref_ids[:index]) if plain is not None else None
        report.divergences.append(Divergence(prompt, index, ref_ids, cmp_ids, gap, classify(gap, tie_gap)))
    return report


def compare_pair(reference: ServiceHandle, compared: ServiceHandle, prompts: Sequence[str], *,
                 max_tokens: int = 32) -> ParityReport:
    """compare_greedy for two services of one host, using the profile's [parity] plain service for triage."""
    spec = reference.host.profile.parity
    plain = reference.host.service(spec.plain) if spec and spec.plain else None
    if plain is not None:
        plain.ensure_ready()
    return compare_greedy(reference.client, compared.client, prompts, max_tokens=max_tokens,
                          plain=plain.client if plain else None, tie_gap=spec.tie_gap if spec else 1e-3)
