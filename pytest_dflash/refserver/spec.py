"""Decoding: sampling parameters, the target's processed distribution, and NONE / DFLASH / DDTREE steps.

All three algorithms emit tokens drawn from the TARGET's distribution (target-only verification,
as SGLang's DFlash does): at every visited position the target's choice is made first (argmax, or a
draw with one uniform from the request's generator) and a draft token is accepted iff it equals that
choice. So with the same seed NONE, DFLASH and DDTREE emit identical tokens, and greedy output is
identical by construction (see model.py for why the logit rows match exactly).

DFLASH drafts ``block_size - 1`` tokens (the block's first slot is the last accepted token, as in
SGLang, where ``spec_num_proposed_drafts = verify_ct * (block_size - 1)``) and verifies the chain in
one target pass. DDTREE builds a tree best-first from the drafter's per-position candidates under a
node budget and verifies all nodes in one pass with an ancestor-only mask.

EAGLE / EAGLE3 / STANDALONE draft ``num_steps`` tokens autoregressively with the drafter (a chain with
``topk`` 1, else a best-first tree of ``num_draft_tokens - 1`` nodes over the top-``topk`` candidates per
step); NGRAM has no draft model: it drafts the tokens that followed the latest earlier occurrence of the
sequence's last 1-3 tokens (prompt and output). All of them verify through the same walk as DFLASH, so
every algorithm is lossless here by construction. ``random_draft`` replaces the drafter by random rows:
a draft that is (almost) never accepted, as a random-weight draft model on a real server.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pytest_dflash.refserver.model import EOS_IDS, VOCAB_SIZE, Drafter, KVCache, TinyLM
from pytest_dflash.refserver.structured import Constraint, GrammarBackend, masked

__all__ = ["ALGORITHMS", "Engine", "SamplingParams", "Sequence", "SpecStats", "Step", "processed_probs"]

ALGORITHMS = ("NONE", "DFLASH", "DDTREE", "EAGLE", "EAGLE3", "NGRAM", "STANDALONE")
DRAFT_HEAD_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")  # draft num_steps tokens, a chain or a top-k tree
NGRAM_MAX_MATCH = 3  # the longest suffix NGRAM looks up
SAMPLING_EPS = 1e-6  # SGLang treats temperature below this as greedy


@dataclass
class SamplingParams:
    """SGLang's per-request sampling parameters (the subset the refserver implements)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    sampling_seed: int | None = None
    n: int = 1
    grammar: tuple[str, str] | None = None  # SGLang's grammar key: ("json" | "regex" | "ebnf", value)
    # SGLang's req.require_reasoning (a chat under --reasoning-parser): the grammar waits for the think-end
    reasoning: bool = False
    # SGLang 0.5.17 under --grammar-backend none, a streamed constrained /generate: the scheduler refuses the
    # grammar after the first token, in-band (HTTP 200, one event, finish_reason abort with status_code 400)
    abort_after_first: str | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def needs_sampling_kernel(self) -> bool:
        """SGLang's torch path covers temperature-only; top-k/top-p/min-p go to FlashInfer's kernel."""
        if self.is_greedy:
            return False
        return 1 < self.top_k < VOCAB_SIZE or self.top_p < 1.0 or self.min_p > 0.0


def processed_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution a sampled request draws from: softmax(logits / T), then top-k, top-p, min-p.

    Same order and rules as SGLang's torch sampler (top_k_top_p_min_p_sampling_from_probs_torch).
    """
    z = logits / params.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")  # ties: lower id first
    sorted_p = p[order]
    keep = np.ones(len(p), dtype=bool)
    if 0 < params.top_k < len(p):
        keep[params.top_k :] = False
    keep &= (np.cumsum(sorted_p) - sorted_p) <= params.top_p
    if params.min_p > 0:
        keep &= sorted_p >= sorted_p[0] * params.min_p
    out: np.ndarray = np.zeros_like(p)
    out[order[keep]] = sorted_p[keep]
    out /= out.sum()
    return out


def choose(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The target's choice at one position: argmax (lowest id on ties) or one inverse-CDF draw."""
    if params.is_greedy:
        return int(np.argmax(logits))
    cdf = np.cumsum(processed_probs(logits, params))
    return int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))


def second_choice(logits: np.ndarray, params: SamplingParams) -> int:
    """The target's runner-up (by logit); only the tree-verify-bug fault looks at it."""
    return int(np.argsort(-logits, kind="stable")[1])


@dataclass
class SpecStats:
    """Per-request speculative accounting, with SGLang's meta_info names."""

    verify_ct: int = 0
    accepted_drafts: int = 0
    proposed_drafts: int = 0
    histogram: list[int] = field(default_factory=list)

    def record(self, accepted: int, proposed: int) -> None:
        self.verify_ct += 1
        self.accepted_drafts += accepted
        self.proposed_drafts += proposed
        while len(self.histogram) <= accepted:
            self.histogram.append(0)
        self.histogram[accepted] += 1


class Step(NamedTuple):
    """Tokens chosen by one step, and the target logit row each was chosen from."""

    tokens: list[int]
    rows: list[np.ndarray]


@dataclass
class Sequence:
    """One request's decoding state. ``cache`` holds every committed token but the last one."""

    prompt: list[int]
    params: SamplingParams
    rng: np.random.Generator
    cache: KVCache
    output: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    constraint: Constraint | None = None  # the request's grammar matcher (structured.py)


class Engine:
    """The target, the drafter and one decoding algorithm."""

    def __init__(
        self,
        target: TinyLM,
        algorithm: str,
        *,
        block_size: int = 8,
        ddtree_budget: int = 32,
        greedy_verify_only: bool = False,
        tree_verify_bug: bool = False,
        num_steps: int = 3,
        topk: int = 1,
        random_draft: bool = False,
        grammar: GrammarBackend | None = None,
        grammar_rollback_bug: bool = False,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown speculative algorithm {algorithm!r}")
        self.target = target
        self.drafter = Drafter(target, random_draft=random_draft)
        self.num_steps = num_steps
        self.topk = topk
        self.algorithm = algorithm
        self.block_size = block_size
        self.ddtree_budget = ddtree_budget
        self.greedy_verify_only = greedy_verify_only  # the greedy-fallback fault
        self.tree_verify_bug = tree_verify_bug and algorithm == "DDTREE"
        self.grammar = grammar  # None: --grammar-backend none (the HTTP side refuses constrained requests)
        self.grammar_rollback_bug = grammar_rollback_bug

    def start(self, prompt: list[int], params: SamplingParams, seed: int) -> tuple[Sequence, Step]:
        """Prefill the prompt in one pass and choose the first token (the caller appends it)."""
        seq = Sequence(prompt, params, np.random.default_rng(seed), self.target.new_cache(len(prompt) + 64))
        logits = self.target.forward(prompt, seq.cache)
        seq.cache.keep(list(range(len(prompt))))
        row = logits[-1]
        if params.grammar is not None and self.grammar is not None:
            seq.constraint = self.grammar.constraint(params.grammar, reasoning=params.reasoning)
            row = masked(row, seq.constraint.allowed())
        first = choose(row, params, seq.rng)
        if seq.constraint is not None:
            seq.constraint.accept(first)
        return seq, Step([first], [row])

    def step(self, seq: Sequence) -> Step:
        """One decode step (NONE) or one draft + verify step after ``seq.output[-1]``: >= 1 tokens."""
        pending = seq.output[-1]
        if self.algorithm == "NONE":
            logits = self.target.forward([pending], seq.cache)
            seq.cache.keep([0])
            row = logits[0]
            if seq.constraint is not None:
                row = masked(row, seq.constraint.allowed())
            token = choose(row, seq.params, seq.rng)
            if seq.constraint is not None:
                seq.constraint.accept(token)
            return Step([token], [row])
        tokens, parents = self._draft(pending, seq)
        logits = self.target.forward([pending, *tokens], seq.cache, [-1, *parents])
        if seq.constraint is not None:  # the verify's grammar masks, one per row, from the draft tree
            masks = seq.constraint.draft_masks(tokens, parents)
            logits = np.stack([masked(row, mask) for row, mask in zip(logits, masks, strict=True)])
        path, emitted = self._walk(logits, tokens, parents, seq)
        if seq.constraint is not None:
            rejected = next(iter(self._children(tokens, parents).get(path[-1], {})), None)
            seq.constraint.commit(emitted, rejected, rollback_bug=self.grammar_rollback_bug)
        seq.cache.keep(path)
        # proposed = block_size - 1 per verify step for DDTREE too, whatever the tree budget: the real
        # ddtree-v2 port counts it so (H200: spec_proposed_drafts 150 = 10 verify steps x 15 at budget 32;
        # accept rate 4/15)
        proposed = len(tokens) if self.algorithm in DRAFT_HEAD_ALGORITHMS else self.block_size - 1
        seq.stats.record(accepted=len(path) - 1, proposed=proposed)
        return Step(emitted, [logits[row] for row in path])

    def _draft(self, pending: int, seq: Sequence) -> tuple[list[int], list[int]]:
        """The draft tokens after ``pending`` and their parents (0: the pending token, i: draft token i)."""
        if self.algorithm == "NGRAM":
            tokens = ngram_draft([*seq.prompt, *seq.output], self.block_size - 1)
            return tokens, list(range(len(tokens)))
        if self.algorithm in DRAFT_HEAD_ALGORITHMS:
            rows = self.drafter.propose(pending, seq.cache, self.num_steps)
            if self.topk == 1:
                tokens = [int(r.argmax()) for r in rows]
                return tokens, list(range(len(tokens)))
            return build_tree(rows, self.block_size - 1, top=self.topk)
        rows = self.drafter.propose(pending, seq.cache, self.block_size - 1)
        if self.algorithm == "DFLASH":
            tokens = [int(r.argmax()) for r in rows]
            return tokens, list(range(len(tokens)))  # draft i hangs under row i (row 0: the pending token)
        return build_tree(rows, self.ddtree_budget)

    def _walk(
        self, logits: np.ndarray, tokens: list[int], parents: list[int], seq: Sequence
    ) -> tuple[list[int], list[int]]:
        """Follow the nodes whose token equals the target's choice; return kept rows and new tokens."""
        params = seq.params
        if self.greedy_verify_only:
            params = SamplingParams(temperature=0.0)
        children = self._children(tokens, parents)
        node, path, emitted = 0, [0], []
        while True:
            choice = choose(logits[node], params, seq.rng)
            nxt = children.get(node, {}).get(choice)
            if nxt is None and self.tree_verify_bug:
                runner_up = second_choice(logits[node], params)
                if (nxt := children.get(node, {}).get(runner_up)) is not None:
                    choice = runner_up
            emitted.append(choice)
            if nxt is None:
                return path, emitted
            path.append(nxt)
            node = nxt

    @staticmethod
    def _children(tokens: list[int], parents: list[int]) -> dict[int, dict[int, int]]:
        """Each node's children by token, in draft order (node rows start at 1; 0 is the pending token)."""
        children: dict[int, dict[int, int]] = {}
        for i, (tok, parent) in enumerate(zip(tokens, parents, strict=True)):
            children.setdefault(parent, {}).setdefault(tok, i + 1)
        return children


def ngram_draft(context: list[int], length: int) -> list[int]:
    """NGRAM's draft: the ``length`` tokens that followed the latest earlier occurrence of the context's last
    NGRAM_MAX_MATCH (else fewer, down to 1) tokens; empty when even the last token never occurred before."""
    for n in range(min(NGRAM_MAX_MATCH, len(context) - 1), 0, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == suffix:
                return context[start + n : start + n + length]
    return []


def build_tree(rows: list[np.ndarray], budget: int, *, top: int = 16) -> tuple[list[int], list[int]]:
    """Best-first draft tree: a node's score is the sum of its path's per-position log-probabilities.

    Returns the nodes' tokens and parents (0 = the root, node i is row i + 1). Each popped node
    pushes its next sibling (same parent, next candidate at its depth) and its first child.
    """
    top = min(budget, top)
    cands = [np.argsort(-r, kind="stable")[:top] for r in rows]
    tokens: list[int] = []
    parents: list[int] = []
    counter = 0
    # (-score, tiebreak, depth, rank, parent node, parent's score)
    heap: list[tuple[float, int, int, int, int, float]] = [(-rows[0][cands[0][0]], 0, 0, 0, 0, 0.0)]
    while heap and len(tokens) < budget:
        neg, _, depth, rank, parent, parent_score = heapq.heappop(heap)
        tokens.append(int(cands[depth][rank]))
        parents.append(parent)
        me = len(tokens)
        score = -neg
        counter += 1
        if rank + 1 < top:
            s = parent_score + rows[depth][cands[depth][rank + 1]]
            heapq.heappush(heap, (-s, counter, depth, rank + 1, parent, parent_score))
        if depth + 1 < len(rows):
            counter += 1
            s = score + rows[depth + 1][cands[depth + 1][0]]
            heapq.heappush(heap, (-s, counter, depth + 1, 0, me, score))
    return tokens, parents


def finished_by_eos(token: int, params: SamplingParams) -> bool:
    return not params.ignore_eos and token in EOS_IDS


def log_softmax(row: np.ndarray) -> np.ndarray:
    z: np.ndarray = row - row.max()
    z -= math.log(float(np.exp(z).sum()))
    return z
