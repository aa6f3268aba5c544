"""Grammar-constrained parity: under a grammar, greedy speculative output equals the reference's.

Speculation adds grammar work that plain decoding never does: a mask per draft position, and a matcher rolled
back for every rejected draft token. A bug there breaks constrained output, or changes it, only under
speculation, while text parity still passes. So each (grammar, prompt) is sent greedy through native
``/generate`` to the reference and to the compared service; the token ids must be identical. A divergence is
triaged as text parity's are (greedy.py: ``classify``), with the plain server's top logprobs under the same
grammar; a real one fails, naming the token where it departed and the grammar. The compared output must also
be in the grammar's language (layers/generation/structured.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pytest

from pytest_dflash.client.answers import whole_answer
from pytest_dflash.client.bodies import answer_json
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.generation.structured import GRAMMARS, NOT_SERVED, Grammar
from pytest_dflash.layers.parity.greedy import (
    DEFAULT_MAX_TIE_RATE,
    DEFAULT_TIE_GAP,
    TOP_LOGPROBS,
    Candidate,
    Divergence,
    classify,
    first_divergence,
)
from pytest_dflash.layers.parity.plain import ready_plain
from pytest_dflash.run.skips import needs_sglang, not_applicable

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

__all__ = ["PARITY_GRAMMARS", "PARITY_PROMPTS", "ConstrainedRun", "constrained_greedy", "structured_parity"]

PARITY_GRAMMARS = ("json_schema", "regex", "ebnf")
PARITY_PROMPTS = ("The quick brown fox", "Hello world!", "def fibonacci(n):")
MAX_TOKENS = 96


@dataclass(frozen=True)
class ConstrainedRun:
    """One greedy constrained output: its ids, text, finish, and the top logprobs when asked for."""

    ids: tuple[int, ...]
    text: str
    finish: str | None
    top: tuple[tuple[tuple[float, int], ...], ...] = ()


def constrained_greedy(client: InferenceClient, prompt: str, grammar: Grammar, *,
                       max_tokens: int = MAX_TOKENS, logprobs: bool = False) -> ConstrainedRun:
    """Greedy /generate of `prompt` under `grammar`; ApiError when refused."""
    params = {"temperature": 0, "max_new_tokens": max_tokens, grammar.param: grammar.value}
    body: dict[str, Any] = {"text": prompt, "sampling_params": params}
    if logprobs:
        body.update(return_logprob=True, top_logprobs_num=TOP_LOGPROBS)
    response = client.request("POST", "/generate", json_body=body)
    if response.status_code >= 400:
        raise ApiError(client.service, "/generate", response.status_code, "constrained request refused",
                       response.text[:300])
    answer = whole_answer(answer_json(response, client.service, "/generate"), "generate", client.service)
    ids = answer.output_ids
    if ids is None or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or (
            answer.content and not ids):
        # without them two answers would count as token-identical having compared nothing
        raise ApiError(client.service, "/generate", response.status_code,
                       "the answer carries no output_ids (a list of token ids) to compare",
                       response.text[:300])
    steps = tuple(tuple((e.logprob, e.token) for e in step)
                  for step in answer.top_logprobs or ()) if logprobs else ()
    return ConstrainedRun(tuple(int(i) for i in ids), answer.content, answer.finish_reason, steps)


def structured_parity(pair: Sequence[ServiceHandle], *, plain_port: int | None = None) -> None:
    """Greedy constrained output of the compared service equals the reference's for every grammar and prompt,
    up to ties; every compared output is in its grammar's language."""
    __tracebackhide__ = True
    reference, compared = pair
    for service in pair:
        if not service.spec.structured_output:
            not_applicable(f"{NOT_SERVED}: {service.label}")
        needs_sglang(service, "parity compares token ids from SGLang's native /generate")
    spec = reference.host.profile.parity
    tie_gap = spec.tie_gap if spec else DEFAULT_TIE_GAP
    max_tie_rate = spec.max_tie_rate if spec else DEFAULT_MAX_TIE_RATE
    problems: list[str] = []
    divergences: list[tuple[Grammar, Divergence]] = []
    cases = [(GRAMMARS[g], p) for g in PARITY_GRAMMARS for p in PARITY_PROMPTS]
    for grammar, prompt in cases:
        try:
            ref = constrained_greedy(reference.client, prompt, grammar)
            cmp = constrained_greedy(compared.client, prompt, grammar)
        except ApiError as exc:
            problems.append(f"{grammar.describe()}, {prompt!r}: {exc}")
            continue
        if cmp.finish not in ("stop", "length"):
            problems.append(f"{grammar.describe()}, {prompt!r}: {compared.label} finished {cmp.finish!r} "
                            f"after {cmp.text[:80]!r}")
        elif cmp.finish == "stop" and (wrong := grammar.problem(cmp.text)):
            problems.append(f"{grammar.describe()}, {prompt!r}: {compared.label}'s output {cmp.text[:80]!r} "
                            f"{wrong}")
        index = first_divergence(ref.ids, cmp.ids)
        if index is not None:
            divergences.append((grammar, Divergence(prompt, index, ref.ids, cmp.ids, reference_text=ref.text,
                                                    compared_text=cmp.text)))
    divergences = _triaged(reference, divergences, tie_gap, plain_port)
    real = [(g, d) for g, d in divergences if d.kind != "tie"]
    ties = len(divergences) - len(real)
    what = f"{reference.label} vs {compared.label} under grammars"
    if ties / len(cases) > max_tie_rate:
        problems.append(f"{ties}/{len(cases)} constrained outputs diverge at ties "
                        f"(max_tie_rate {max_tie_rate})")
    for grammar, divergence in real:
        problems.append(f"{grammar.describe()}: {divergence.describe()}")
    if problems:
        exact = len(cases) - len(divergences)
        pytest.fail(f"{what}: {exact}/{len(cases)} (grammar, prompt) pairs token-identical; "
                    + "\n  ".join(["", *problems]), pytrace=False)


def _triaged(reference: ServiceHandle, divergences: list[tuple[Grammar, Divergence]], tie_gap: float,
             plain_port: int | None) -> list[tuple[Grammar, Divergence]]:
    """Each divergence classified by the plain server's top logprobs under the same grammar."""
    if not divergences:
        return divergences
    client, why = ready_plain(reference, port=plain_port)
    out = []
    for grammar, d in divergences:
        if client is None:
            out.append((grammar, replace(d, note=why)))
            continue
        try:
            view = constrained_greedy(client, d.prompt, grammar, max_tokens=d.index + 1, logprobs=True)
        except ApiError as exc:
            out.append((grammar, replace(d, note=f"the plain server could not be asked: {exc}")))
            continue
        if view.ids[: d.index] != d.reference_ids[: d.index] or len(view.top) <= d.index:
            out.append((grammar, replace(d, note="the plain server's constrained output departs before it")))
            continue
        ref_tok = d.reference_ids[d.index] if d.index < len(d.reference_ids) else None
        cmp_tok = d.compared_ids[d.index] if d.index < len(d.compared_ids) else None
        verdict = classify(ref_tok, cmp_tok, [Candidate(lp, tok) for lp, tok in view.top[d.index]], tie_gap)
        out.append((grammar, replace(d, kind=verdict.kind, gap=verdict.gap, top12=verdict.top12,
                                     candidates=verdict.candidates, note=verdict.note,
                                     lower_bound=verdict.lower_bound)))
    return out
