"""Distribution parity under sampling: are two services drawing their first K tokens from the same law?

Speculative decoding with a correct verifier samples exactly from the target's distribution, so at
temperature > 0 the first K tokens of many samples from the reference and from a compared service
are two samples of one distribution. A broken verifier (a tree that accepts the target's runner-up,
a build that silently verifies greedily) changes that law; a two-sample test of homogeneity sees it.

The test, per prompt:

* For each prefix length L = 1..K, the distribution of the first L tokens is tested: a shift in the
  first token's law shows at L = 1 with few categories (high power); a sampler that stops sampling
  after the first token (greedy fallback) shows at L >= 2.
* Categories are the L-token prefixes, pooled so every expected cell count is at least
  `min_expected` (5, Cochran's rule for the chi-square approximation): exact K-prefixes that are
  frequent enough stay; the rest fall back to their longest prefix that is frequent enough
  ("prefix p, then anything rarer"), and whatever is left becomes one "other" cell. The pooling
  looks only at the pooled counts (reference + compared), which are fixed under the null
  hypothesis, so it does not bias the test.
* Pearson's chi-square test of homogeneity on the 2 x C table, df = C - 1.
* Every (prompt, L) test runs at alpha / (m K) (Bonferroni over m prompts and K lengths): the
  family-wise false-alarm rate of one service pair is at most `alpha` (default 0.001;
  `tests/layers/parity/test_distribution.py` measures the per-test rate).
* Fewer samples than `min_samples` per side is INCONCLUSIVE: never a pass. Fewer than two cells
  after pooling (both services put all but a few samples on one prefix: they agree there, and there
  is nothing to test) is DEGENERATE; a pair whose every test is degenerate is INCONCLUSIVE too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.layers.generation.requests import generate_batch

Sample = tuple[int, ...]
Outcome = Literal["pass", "fail", "inconclusive", "degenerate"]

DEFAULT_ALPHA = 1e-3
DEFAULT_MIN_SAMPLES = 200
MIN_EXPECTED = 5.0

__all__ = ["Cell", "DistributionReport", "DrawPlan", "PromptResult", "chi2_sf", "combine",
           "compare_distributions", "draw", "homogeneity", "pool"]


# ---- the chi-square distribution -------------------------------------------------------------------


def _gamma_p_series(a: float, x: float) -> float:
    term = total = 1.0 / a
    n = a
    for _ in range(10_000):
        n += 1.0
        term *= x / n
        total += term
        if abs(term) < abs(total) * 1e-15:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_fraction(a: float, x: float) -> float:
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h * math.exp(-x + a * math.log(x) - math.lgamma(a))


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2)."""
    if df <= 0:
        raise ValueError(f"chi-square needs df >= 1, got {df}")
    if x <= 0:
        return 1.0
    a, half = df / 2.0, x / 2.0
    if half < a + 1.0:
        return max(0.0, 1.0 - _gamma_p_series(a, half))
    return min(1.0, _gamma_q_fraction(a, half))


# ---- pooling -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One category of the contingency table: a token prefix, exact or "then anything rarer"."""

    prefix: Sample
    exact: bool
    reference: int
    compared: int

    @property
    def total(self) -> int:
        return self.reference + self.compared

    def label(self, decode: Callable[[Sample], str] | None = None) -> str:
        ids = list(self.prefix)
        text = f" {decode(self.prefix)!r}" if decode is not None and self.prefix else ""
        if not self.prefix:
            return "<everything rarer>"
        return f"{ids}{text}" + ("" if self.exact else " + rarer continuations")


def pool(reference: Sequence[Sample], compared: Sequence[Sample], *,
         min_expected: float = MIN_EXPECTED) -> list[Cell]:
    """Pool sparse categories (see the module docstring) so that every expected count is >= min_expected."""
    n_ref, n_cmp = len(reference), len(compared)
    total = n_ref + n_cmp
    if not n_ref or not n_cmp:
        return []
    # a cell with pooled count c expects c * n_side / total on each side
    threshold = math.ceil(min_expected * total / min(n_ref, n_cmp) - 1e-9)
    depth = max(len(s) for s in (*reference, *compared))
    pending: list[tuple[Sample, int]] = [(s, 0) for s in reference] + [(s, 1) for s in compared]
    cells: list[Cell] = []
    for length in range(depth, 0, -1):
        groups: dict[Sample, list[int]] = {}
        for sample, side in pending:
            groups.setdefault(sample[:length], [0, 0])[side] += 1
        frequent = {prefix for prefix, (r, c) in groups.items() if r + c >= threshold}
        for prefix in sorted(frequent):
            r, c = groups[prefix]
            cells.append(Cell(prefix, exact=length == depth and len(prefix) == depth, reference=r,
                              compared=c))
        pending = [(s, side) for s, side in pending if s[:length] not in frequent]
    rest_ref = sum(1 for _, side in pending if side == 0)
    rest_cmp = len(pending) - rest_ref
    if rest_ref + rest_cmp >= threshold or (not cells and pending):
        cells.append(Cell((), exact=False, reference=rest_ref, compared=rest_cmp))
    elif pending:
        # too few to stand alone: fold into the smallest cell (which then reads "… or rarer")
        index = min(range(len(cells)), key=lambda i: (cells[i].total, i))
        small = cells[index]
        cells[index] = Cell(small.prefix, exact=False, reference=small.reference + rest_ref,
                            compared=small.compared + rest_cmp)
    return cells


# ---- the test ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptResult:
    """One prompt's homogeneity test."""

    prompt: str
    outcome: Outcome
    length: int
    n_reference: int
    n_compared: int
    cells: tuple[Cell, ...] = ()
    statistic: float | None = None
    df: int = 0
    p_value: float | None = None
    alpha: float = DEFAULT_ALPHA
    reason: str = ""

    @property
    def total_variation(self) -> float | None:
        """Total variation distance between the two empirical distributions over the pooled cells."""
        if not self.cells or not self.n_reference or not self.n_compared:
            return None
        return 0.5 * sum(abs(c.reference / self.n_reference - c.compared / self.n_compared)
                         for c in self.cells)

    def worst_cells(self, count: int = 3) -> list[Cell]:
        """The cells that contribute most to the statistic (where the two distributions differ)."""
        if not self.cells:
            return []
        n = self.n_reference + self.n_compared

        def contribution(cell: Cell) -> float:
            er = cell.total * self.n_reference / n
            ec = cell.total * self.n_compared / n
            return (cell.reference - er) ** 2 / er + (cell.compared - ec) ** 2 / ec

        return sorted(self.cells, key=contribution, reverse=True)[:count]

    def describe(self, decode: Callable[[Sample], str] | None = None) -> str:
        tokens = f"first {self.length} token{'s' if self.length > 1 else ''}"
        head = f"{self.prompt[:40]!r}, {tokens}: {self.outcome.upper()}"
        sizes = f"n = {self.n_reference} reference / {self.n_compared} compared samples"
        if self.statistic is None or self.p_value is None:
            return f"{head} ({self.reason}; {sizes})"
        tv = self.total_variation
        text = (f"{head}: Pearson chi-square X2 = {self.statistic:.1f}, df = {self.df}, p = "
                f"{self.p_value:.3g} {'<' if self.p_value < self.alpha else '>='} alpha = {self.alpha:.3g}; "
                f"{sizes}; total variation {tv:.3f}")
        if self.outcome == "fail":
            rows = [f"{c.label(decode)}: reference {c.reference}, compared {c.compared}"
                    for c in self.worst_cells()]
            text += "\n      largest differences: " + "; ".join(rows)
        return text


def homogeneity(prompt: str, reference: Sequence[Sample], compared: Sequence[Sample], *, alpha: float,
                min_samples: int = DEFAULT_MIN_SAMPLES, min_expected: float = MIN_EXPECTED,
                length: int | None = None) -> PromptResult:
    """Pearson chi-square test of homogeneity of two samples of token prefixes (cut to `length`), after
    pooling."""
    if length is not None:
        reference = [s[:length] for s in reference]
        compared = [s[:length] for s in compared]
    size = length if length is not None else max((len(s) for s in (*reference, *compared)), default=0)
    n_ref, n_cmp = len(reference), len(compared)
    if min(n_ref, n_cmp) < min_samples:
        return PromptResult(prompt, "inconclusive", size, n_ref, n_cmp, alpha=alpha,
                            reason=f"too few samples: need at least {min_samples} per side")
    cells = pool(reference, compared, min_expected=min_expected)
    if len(cells) < 2:
        return PromptResult(prompt, "degenerate", size, n_ref, n_cmp, tuple(cells), alpha=alpha,
                            reason="fewer than 2 categories after pooling: both services put (almost) every "
                                   "sample on one prefix, nothing to test")
    n = n_ref + n_cmp
    statistic = 0.0
    for cell in cells:
        for observed, side in ((cell.reference, n_ref), (cell.compared, n_cmp)):
            expected = cell.total * side / n
            statistic += (observed - expected) ** 2 / expected
    df = len(cells) - 1
    p_value = chi2_sf(statistic, df)
    outcome: Outcome = "fail" if p_value < alpha else "pass"
    return PromptResult(prompt, outcome, size, n_ref, n_cmp, tuple(cells), statistic, df, p_value, alpha)


@dataclass
class DistributionReport:
    """All prompts of one reference/compared pair, tested at a family-wise alpha."""

    alpha: float
    tokens: int
    sampling: str
    results: list[PromptResult] = field(default_factory=list)

    @property
    def outcome(self) -> Outcome:
        """fail if any test rejects; inconclusive if samples were too few or no test was possible;
        else pass."""
        if any(r.outcome == "fail" for r in self.results):
            return "fail"
        if not any(r.outcome == "pass" for r in self.results) or any(r.outcome == "inconclusive"
                                                                      for r in self.results):
            return "inconclusive"
        return "pass"

    def as_fact(self) -> dict[str, object]:
        return {"outcome": self.outcome, "alpha": self.alpha, "tokens": self.tokens,
                "sampling": self.sampling,
                "test": "Pearson chi-square test of homogeneity, Bonferroni over prompts and prefix lengths",
                "tests": [{"prompt": r.prompt[:60], "length": r.length, "outcome": r.outcome,
                           "n_reference": r.n_reference, "n_compared": r.n_compared,
                           "statistic": r.statistic, "df": r.df, "p_value": r.p_value,
                           "total_variation": r.total_variation} for r in self.results]}

    def check(self, *, evidence: str = "", min_samples: int = DEFAULT_MIN_SAMPLES) -> None:
        """Raise AssertionError unless the outcome is pass (inconclusive fails too: it is not a pass)."""
        __tracebackhide__ = True
        if self.outcome == "pass":
            return
        text = self.describe()
        if self.outcome == "inconclusive":
            text += (f"\nINCONCLUSIVE is not a pass: raise --dist-samples (at least {min_samples} per prompt "
                     "and service) or use prompts whose first tokens vary at this temperature")
        raise AssertionError(text + (f"\n{evidence}" if evidence else ""))

    def describe(self, decode: Callable[[Sample], str] | None = None) -> str:
        per = self.alpha / max(1, len(self.results))
        prompts = len({r.prompt for r in self.results})
        head = (f"distribution parity {self.outcome.upper()}: the first 1..{self.tokens} tokens at "
                f"{self.sampling}; Pearson chi-square test of homogeneity per prompt and prefix length at "
                f"alpha = {per:.3g} (family-wise false-alarm rate <= {self.alpha:g}, Bonferroni over "
                f"{prompts} prompts x {self.tokens} lengths)")
        # the failing tests, then one line per prompt for the rest (its smallest p-value)
        lines = [f"  {r.describe(decode)}" for r in self.results if r.outcome in ("fail", "inconclusive")]
        for prompt in dict.fromkeys(r.prompt for r in self.results):
            passed = [r for r in self.results if r.prompt == prompt and r.outcome == "pass"]
            flat = [r.length for r in self.results if r.prompt == prompt and r.outcome == "degenerate"]
            parts = []
            if passed:
                low = min(passed, key=lambda r: r.p_value if r.p_value is not None else 1.0)
                parts.append(f"{len(passed)} length(s) pass, smallest p = {low.p_value:.3g} (first "
                             f"{low.length} tokens)")
            if flat:
                parts.append(f"lengths {flat} degenerate (one prefix holds almost every sample: nothing "
                             "to test)")
            if parts:
                lines.append(f"  {prompt[:40]!r}: {'; '.join(parts)}")
        return "\n".join([head, *lines])


def combine(prompt_samples: Sequence[tuple[str, Sequence[Sample], Sequence[Sample]]], *, alpha: float,
            tokens: int, sampling: str, min_samples: int = DEFAULT_MIN_SAMPLES) -> DistributionReport:
    """Test every prompt at every prefix length 1..tokens, at alpha / (prompts x tokens) (Bonferroni)."""
    report = DistributionReport(alpha, tokens, sampling)
    per = alpha / max(1, len(prompt_samples) * tokens)
    for prompt, reference, compared in prompt_samples:
        for length in range(1, tokens + 1):
            report.results.append(homogeneity(prompt, reference, compared, alpha=per, min_samples=min_samples,
                                              length=length))
    return report


# ---- drawing the samples -------------------------------------------------------------------------------

COMPARED_SEED_OFFSET = 1_000_003  # reference and compared samples use disjoint seeds: independent samples


@dataclass(frozen=True)
class DrawPlan:
    """How to sample: `count` samples per prompt and side, first `tokens` tokens, at `sampling`."""

    count: int = DEFAULT_MIN_SAMPLES
    tokens: int = 4
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    chunk: int = 100

    def sampling(self) -> Sampling:
        return Sampling(max_tokens=self.tokens, temperature=self.temperature, top_k=self.top_k,
                        top_p=self.top_p, ignore_eos=True)

    def describe(self) -> str:
        parts = [f"temperature {self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top_k {self.top_k}")
        if self.top_p is not None:
            parts.append(f"top_p {self.top_p:g}")
        return ", ".join(parts)


def draw(client: InferenceClient, prompt: str, plan: DrawPlan, *, seed_base: int,
         timeout_s: float | None = None) -> list[Sample]:
    """`plan.count` samples of the first `plan.tokens` tokens, seeds seed_base.., batched natively."""
    base = plan.sampling()
    out: list[Sample] = []
    for start in range(0, plan.count, plan.chunk):
        size = min(plan.chunk, plan.count - start)
        samplings = [replace(base, seed=seed_base + start + i) for i in range(size)]
        for gen in generate_batch(client, [prompt] * size, samplings, timeout_s=timeout_s):
            out.append(tuple(gen.output_ids or ())[: plan.tokens])
    return out


def compare_distributions(reference: InferenceClient, compared: InferenceClient, prompts: Sequence[str],
                          plan: DrawPlan, *, alpha: float = DEFAULT_ALPHA,
                          min_samples: int = DEFAULT_MIN_SAMPLES,
                          reference_samples: dict[str, list[Sample]] | None = None,
                          timeout_s: float | None = None) -> DistributionReport:
    """Sample both services on every prompt and test homogeneity (reference samples reused from the
    cache dict)."""
    cache = reference_samples if reference_samples is not None else {}
    table = []
    for prompt in prompts:
        if prompt not in cache:
            cache[prompt] = draw(reference, prompt, plan, seed_base=plan.seed, timeout_s=timeout_s)
        theirs = draw(compared, prompt, plan, seed_base=plan.seed + COMPARED_SEED_OFFSET, timeout_s=timeout_s)
        table.append((prompt, cache[prompt], theirs))
    return combine(table, alpha=alpha, tokens=plan.tokens, sampling=plan.describe(), min_samples=min_samples)
