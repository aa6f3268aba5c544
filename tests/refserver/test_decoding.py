"""Decoding in-process: losslessness, sampling distributions, accept length, the decoding faults."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest
from refserver_helpers import Job, run_jobs

from pytest_dflash.refserver.model import BUILTIN_PROMPTS, ByteTokenizer, TinyLM, apply_chat_template
from pytest_dflash.refserver.scheduler import Output
from pytest_dflash.refserver.spec import Engine, SamplingParams, Sequence, build_tree, processed_probs

tok = ByteTokenizer()
ALPHA = 1e-3  # false-alarm rate of each chi-square test (seeds are fixed, so a pass is reproducible)


def greedy(max_new_tokens: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, top_k=1, **kw)  # type: ignore[arg-type]


# --- losslessness -----------------------------------------------------------------------------------


def parity_jobs(model: TinyLM) -> list[Job]:
    """60 greedy cases: short, long, chat, lengths around the block size, stop strings and stop ids."""
    rng = random.Random(1234)
    printable = [chr(c) for c in range(32, 127)]
    jobs = [Job(tok.encode(p), greedy(64)) for p in BUILTIN_PROMPTS]
    for _ in range(20):
        text = "".join(rng.choice(printable) for _ in range(rng.randint(1, 80)))
        jobs.append(Job(tok.encode(text), greedy(rng.choice([1, 2, 3, 7, 8, 9, 16, 33]))))
    for n in (600, 900, 1500):
        jobs.append(Job(tok.encode("".join(rng.choice(printable) for _ in range(n))), greedy(24)))
    for i in range(4):
        chat = apply_chat_template([{"role": "user", "content": f"Tell me about {i} things"}])
        jobs.append(Job(tok.encode(chat), greedy(120)))
    # greedy decoding of this tiny model rarely ends; this chat prompt reaches EOS after ~570 tokens
    chat = apply_chat_template([{"role": "user", "content": "Hello number 1"}])
    jobs.append(Job(tok.encode(chat), greedy(700)))
    jobs.append(Job(tok.encode(apply_chat_template([{"role": "user", "content": "x"}])), greedy(40, ignore_eos=True)))
    # stop strings and stop ids picked from the target's own greedy output
    probes = [Job(tok.encode(f"{p} #{i}"), greedy(48)) for i, p in enumerate(BUILTIN_PROMPTS)]
    engine = Engine(model, "NONE")
    for job, out in zip(probes, run_jobs(engine, probes), strict=True):
        text = tok.decode(out.output_ids)
        jobs.append(Job(job.prompt, greedy(48, stop=[text[10:12]])))
        jobs.append(Job(job.prompt, greedy(48, stop_token_ids=[out.output_ids[5]])))
    return jobs


def test_greedy_is_token_identical_for_none_dflash_ddtree(model: TinyLM) -> None:
    jobs = parity_jobs(model)
    assert len(jobs) >= 50
    outs = {algo: run_jobs(Engine(model, algo, ddtree_budget=24), jobs) for algo in ("NONE", "DFLASH", "DDTREE")}
    kinds = Counter(_finish_kind(o) for o in outs["NONE"])
    assert {"length", "eos", "stop_str", "stop_id"} <= set(kinds), kinds  # every ending is exercised
    for algo in ("DFLASH", "DDTREE"):
        for i, (ref, got) in enumerate(zip(outs["NONE"], outs[algo], strict=True)):
            pairs = zip(ref.output_ids, got.output_ids, strict=False)
            first = next((j for j, (a, b) in enumerate(pairs) if a != b), None)
            assert ref.output_ids == got.output_ids, f"{algo} job {i}: first divergence at token {first}"
            assert ref.finish == got.finish, f"{algo} job {i}"


def _finish_kind(out: Output) -> str:
    finish = out.finish or {}
    if finish.get("type") == "length":
        return "length"
    matched = finish.get("matched")
    if isinstance(matched, str):
        return "stop_str"
    return "eos" if isinstance(matched, int) and matched >= 256 else "stop_id"


def test_same_seed_gives_identical_sampled_output_for_every_algorithm(model: TinyLM) -> None:
    """Target-only verification: one uniform per emitted token, so the sampled text is the same."""
    settings = [
        {"temperature": 0.8},
        {"temperature": 1.0, "top_p": 0.9},
        {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
        {"temperature": 1.2, "min_p": 0.05},
    ]
    jobs = [
        Job(tok.encode(prompt), SamplingParams(max_new_tokens=40, **s), seed=seed)  # type: ignore[arg-type]
        for prompt in BUILTIN_PROMPTS[:4]
        for s in settings
        for seed in (1, 2)
    ]
    outs = {algo: run_jobs(Engine(model, algo, ddtree_budget=24), jobs) for algo in ("NONE", "DFLASH", "DDTREE")}
    for algo in ("DFLASH", "DDTREE"):
        assert [o.output_ids for o in outs[algo]] == [o.output_ids for o in outs["NONE"]], algo
    assert len({tuple(o.output_ids) for o in outs["NONE"]}) > len(jobs) // 2  # seeds matter


# --- acceptance -------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["DFLASH", "DDTREE"])
def test_mean_accept_length_is_realistic_for_block_8(model: TinyLM, algo: str) -> None:
    jobs = [Job(tok.encode(p), greedy(128, ignore_eos=True)) for p in BUILTIN_PROMPTS]
    outs = run_jobs(Engine(model, algo, block_size=8, ddtree_budget=32), jobs)
    verify = sum(o.stats.verify_ct for o in outs)
    accepted = sum(o.stats.accepted_drafts for o in outs)
    mean = (accepted + verify) / verify
    assert 2.0 <= mean <= 6.0, f"{algo} mean accept length {mean:.2f}"
    for o in outs:  # SGLang's accounting: the prefill token has no verify step
        assert sum(o.stats.histogram) == o.stats.verify_ct
        assert len(o.output_ids) <= accepted + verify + len(outs)
        if algo == "DFLASH":
            assert o.stats.proposed_drafts == 7 * o.stats.verify_ct


def test_ddtree_tree_is_best_first_and_within_budget() -> None:
    rng = np.random.default_rng(0)
    rows = [np.log(p) for p in rng.dirichlet(np.full(20, 0.3), size=7)]
    tokens, parents = build_tree(rows, 24)
    assert len(tokens) == 24
    scores = []
    depth = {0: -1}
    score = {0: 0.0}
    for i, (t, p) in enumerate(zip(tokens, parents, strict=True), start=1):
        assert p < i
        depth[i] = depth[p] + 1
        score[i] = score[p] + rows[depth[i]][t]
        scores.append(score[i])
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(scores))  # popped best-first
    siblings = Counter(zip(parents, tokens, strict=True))
    assert max(siblings.values()) == 1


def test_processed_probs_apply_top_k_top_p_min_p_in_sglang_order() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04]))
    assert np.count_nonzero(processed_probs(logits, SamplingParams(top_k=2))) == 2
    assert np.count_nonzero(processed_probs(logits, SamplingParams(top_p=0.65))) == 2  # 0.4 + 0.3 >= 0.65
    assert np.count_nonzero(processed_probs(logits, SamplingParams(min_p=0.5))) == 3  # >= 0.2
    assert processed_probs(logits, SamplingParams()).sum() == pytest.approx(1.0)


# --- sampling distributions --------------------------------------------------------------------------


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for a chi-square with df degrees of freedom: the regularised upper gamma Q(df/2, x/2)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    if z < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        k = a
        while abs(term) > abs(total) * 1e-15:
            k += 1
            term *= z / k
            total += term
        return 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a))
    b, c, d = z + 1 - a, 1e300, 1 / (z + 1 - a)  # continued fraction for Q (Lentz)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h * math.exp(-z + a * math.log(z) - math.lgamma(a))


def chi2_threshold(alpha: float, df: int) -> float:
    """The x with chi2_sf(x, df) == alpha, by bisection."""
    lo, hi = 0.0, 10.0 * df + 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return hi


def test_chi2_sf_matches_known_values() -> None:
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, abs=1e-9)
    assert chi2_threshold(1e-3, 4) == pytest.approx(18.46682695, rel=1e-6)


def chi_square(counts: Counter[object], expected_p: dict[object, float], n: int) -> tuple[float, float]:
    """Statistic and threshold at ALPHA; cells with expected count < 5 pooled into one."""
    cells, pooled_e, pooled_o = [], 0.0, 0
    for key, p in expected_p.items():
        e = p * n
        if e >= 5:
            cells.append((counts.get(key, 0), e))
        else:
            pooled_e, pooled_o = pooled_e + e, pooled_o + counts.get(key, 0)
    unexpected = sum(c for k, c in counts.items() if k not in expected_p)
    assert unexpected == 0, f"{unexpected} samples of tokens the target gives probability 0"
    if pooled_e > 0:
        cells.append((pooled_o, pooled_e))
    assert len(cells) >= 4, "too few cells for a meaningful test"
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return stat, chi2_threshold(ALPHA, len(cells) - 1)


def flat_prefix(model: TinyLM, params: SamplingParams) -> list[int]:
    """A prompt plus greedy tokens, cut where the target's processed distribution is flattest."""
    prompt = tok.encode("Hello world!")
    out = run_jobs(Engine(model, "NONE"), [Job(prompt, greedy(24))])[0].output_ids
    best, best_h = 1, -1.0
    for cut in range(1, len(out)):
        cache = model.new_cache()
        p = processed_probs(model.forward(prompt + out[:cut], cache)[-1], params)
        h = float(-(p[p > 0] * np.log(p[p > 0])).sum())
        if h > best_h:
            best, best_h = cut, h
    return prompt + out[:best]


def next_probs(model: TinyLM, prefix: list[int], params: SamplingParams) -> np.ndarray:
    return processed_probs(model.forward(prefix, model.new_cache())[-1], params)


class Sampler:
    """Many samples of the tokens after ``prefix`` (its last token pending, as after a prefill)."""

    def __init__(self, engine: Engine, prefix: list[int], params: SamplingParams) -> None:
        self.engine, self.prefix, self.params = engine, prefix, params
        self.base, _ = engine.start(prefix[:-1], params, 0)  # prefilled once, forked per sample
        self.with_accepted_drafts = 0  # samples whose first step accepted at least one draft

    def sample(self, seed: int, n_tokens: int) -> list[int]:
        seq = Sequence(self.prefix[:-1], self.params, np.random.default_rng(seed), self.base.cache.copy())
        seq.output = [self.prefix[-1]]
        out: list[int] = []
        while len(out) < n_tokens:
            step = self.engine.step(seq)
            seq.output += step.tokens
            out += step.tokens
            if len(out) == len(step.tokens) and seq.stats.accepted_drafts:
                self.with_accepted_drafts += 1
        return out[:n_tokens]


@pytest.mark.parametrize("algo", ["NONE", "DFLASH", "DDTREE"])
def test_first_token_follows_the_target_distribution(model: TinyLM, algo: str) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=8)
    prefix = flat_prefix(model, params)
    p = next_probs(model, prefix, params)
    sampler = Sampler(Engine(model, algo, block_size=4, ddtree_budget=8), prefix, params)  # small: fast
    n = 2000
    counts = Counter(sampler.sample(seed, 1)[0] for seed in range(n))
    stat, threshold = chi_square(counts, {t: float(p[t]) for t in np.flatnonzero(p)}, n)
    assert stat < threshold, f"{algo}: chi2={stat:.1f} >= {threshold:.1f} at alpha={ALPHA}"


@pytest.mark.parametrize("algo", ["DFLASH", "DDTREE"])
def test_first_two_tokens_follow_the_target_joint_distribution(model: TinyLM, algo: str) -> None:
    """The second token often comes from an accepted draft's row: this checks that path too."""
    params = SamplingParams(temperature=1.0, top_k=4, max_new_tokens=8)
    prefix = flat_prefix(model, params)
    p1 = next_probs(model, prefix, params)
    joint = {}
    for a in np.flatnonzero(p1):
        p2 = next_probs(model, [*prefix, int(a)], params)
        for b in np.flatnonzero(p2):
            joint[(int(a), int(b))] = float(p1[a] * p2[b])
    sampler = Sampler(Engine(model, algo, block_size=4, ddtree_budget=8), prefix, params)
    n = 2000
    counts: Counter[object] = Counter()
    for seed in range(n):
        a, b = sampler.sample(seed, 2)
        counts[(a, b)] += 1
    assert sampler.with_accepted_drafts > n // 10  # the accepted-draft path was exercised
    stat, threshold = chi_square(counts, dict(joint), n)
    assert stat < threshold, f"{algo}: chi2={stat:.1f} >= {threshold:.1f} at alpha={ALPHA}"


def test_chi_square_catches_a_sampler_that_ignores_top_p(model: TinyLM) -> None:
    """The distribution test can fail: samples from the wrong distribution are rejected."""
    right = SamplingParams(temperature=1.0, top_p=0.95)
    wrong = SamplingParams(temperature=1.3)
    prefix = flat_prefix(model, right)
    p = next_probs(model, prefix, right)
    sampler = Sampler(Engine(model, "NONE"), prefix, wrong)
    counts = Counter(sampler.sample(seed, 1)[0] for seed in range(2000))
    support = {t: float(p[t]) for t in np.flatnonzero(p)}
    counts = Counter({t: c for t, c in counts.items() if t in support})  # compare on the support only
    stat, threshold = chi_square(counts, support, sum(counts.values()))
    assert stat > threshold


# --- decoding faults --------------------------------------------------------------------------------


def test_greedy_fallback_ignores_temperature_after_the_first_token(model: TinyLM) -> None:
    prompt = tok.encode(BUILTIN_PROMPTS[3])
    params = SamplingParams(temperature=1.0, max_new_tokens=32)
    jobs = [Job(prompt, params, seed=s) for s in range(4)]
    broken = run_jobs(Engine(model, "DFLASH", greedy_verify_only=True), jobs)
    honest = run_jobs(Engine(model, "DFLASH"), jobs)
    for out in broken:  # everything after the (target-sampled) first token is the greedy continuation
        ref = run_jobs(Engine(model, "NONE"), [Job(prompt + out.output_ids[:1], greedy(31))])[0]
        assert out.output_ids[1:] == ref.output_ids
    assert [o.output_ids for o in honest] != [o.output_ids for o in broken]


def test_tree_verify_bug_makes_ddtree_diverge_at_temperature_zero(model: TinyLM) -> None:
    jobs = [Job(tok.encode(p), greedy(64)) for p in BUILTIN_PROMPTS]
    ref = run_jobs(Engine(model, "NONE"), jobs)
    buggy = run_jobs(Engine(model, "DDTREE", tree_verify_bug=True), jobs)
    diverged = sum(a.output_ids != b.output_ids for a, b in zip(ref, buggy, strict=True))
    assert diverged >= len(jobs) // 2, f"only {diverged} of {len(jobs)} built-in prompts diverged"
    chain = run_jobs(Engine(model, "DFLASH", tree_verify_bug=True), jobs)  # a DDTREE-only bug
    assert [o.output_ids for o in chain] == [o.output_ids for o in ref]
