"""Parity: is speculative decoding lossless? Token-level comparison of greedy outputs, with tie triage.

At temperature 0 a lossless speculative server emits exactly the target model's greedy tokens. Ties
are real, though: on an H200, SGLang 0.5.17's DFLASH and the plain server diverged where two tokens
had exactly the same logprob (-1.6786701679229736), with CUDA graphs on and inside a concurrent batch.
So each first divergence is triaged with a NON-speculative server's top logprobs at that position
(real SGLang refuses ``return_logprob`` under DFLASH):

* the plain server's own greedy output must match the shared prefix up to the divergence (else its
  logprobs are about another context): then its top-k logprobs at the divergence are read;
* TIE when both diverging tokens are within ``tie_gap`` of the top logprob there (so the top-1 /
  top-2 gap is within it too): counted and reported, allowed up to ``max_tie_rate`` of the prompts;
* REAL otherwise (a token the target would not pick, by more than ``tie_gap``): a failure, gap shown;
* UNKNOWN when no plain server is available or it cannot speak for that context: a failure too,
  naming what is missing (a deploy gate cannot call an untriaged divergence lossless).

When the plain server's greedy output leaves the shared prefix earlier (at j), the reference itself
departed from the target there: that departure is triaged first (real: failure), and after a tie the
divergence is re-read by teacher forcing (the prompt's token ids + the shared prefix as ``input_ids``)
where the server reports prompt ids (``logprob_start_len = 0``).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from pytest_dflash.client.answers import Answer, whole_answer
from pytest_dflash.client.bodies import answer_json
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Generation, Sampling
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.parity.plain import ready_plain
from pytest_dflash.layers.parity.prompts import Prompt

if TYPE_CHECKING:
    from pytest_dflash.layers.parity.hooks import LayerOptions
    from pytest_dflash.run.handle import ServiceHandle

Kind = Literal["tie", "noise", "real", "unknown"]
DEFAULT_NOISE_GAP = 0.5
NOISE_NOTE = ("numerical noise: sent again alone, the service gives the reference's token here, so its "
              "kernels' numerics (batch composition, prefix-cache state) moved a near-tie, not the verifier "
              "(SGLang's --enable-deterministic-inference makes them batch-invariant)")
TOP_LOGPROBS = 5
DEFAULT_TIE_GAP = 1e-3
DEFAULT_MAX_TIE_RATE = 0.25


# The smoke suite's slice of the prompt set.
SMOKE_PROMPTS: tuple[str, ...] = (
    "The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time there was a small model that learned to write stories about",
)


# ---- comparison ------------------------------------------------------------------------------------


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, or None when equal (a strict prefix counts as differing)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Candidate:
    logprob: float
    token: int
    text: str | None = None


@dataclass(frozen=True)
class Triage:
    """What the plain server says about one divergence."""

    kind: Kind
    gap: float | None = None  # best logprob minus the lower of the two diverging tokens' logprobs
    top12: float | None = None  # top-1 minus top-2 logprob at the divergence
    candidates: tuple[Candidate, ...] = ()
    note: str = ""
    lower_bound: bool = False  # a diverging token was not among the top-k: the gap is at least `gap`


def classify(reference_token: int | None, compared_token: int | None, candidates: Sequence[Candidate],
             tie_gap: float) -> Triage:
    """Tie or real divergence, from a non-speculative server's top logprobs at the divergence."""
    ordered = tuple(sorted(candidates, key=lambda c: -c.logprob))
    if not ordered:
        return Triage("unknown", note="the plain server returned no top logprobs at the divergence")
    best = ordered[0].logprob
    top12 = best - ordered[1].logprob if len(ordered) > 1 else None
    by_token = {c.token: c.logprob for c in ordered}
    missing = [t for t in (reference_token, compared_token) if t is None or t not in by_token]
    if missing:
        # a token outside the top-k (or no token: one side ended early) trails by more than the k-th candidate
        gap = best - ordered[-1].logprob
        return Triage("real", gap, top12, ordered, lower_bound=True,
                      note=f"token {missing[0]} is not among the top {len(ordered)}" if missing[0] is not None
                      else "one output ended early")
    assert reference_token is not None and compared_token is not None
    gap = best - min(by_token[reference_token], by_token[compared_token])
    return Triage("tie" if gap <= tie_gap else "real", gap, top12, ordered)


@dataclass(frozen=True)
class Divergence:
    prompt: str
    index: int  # first differing output position
    reference_ids: tuple[int, ...]
    compared_ids: tuple[int, ...]
    gap: float | None = None
    kind: Kind = "unknown"
    top12: float | None = None
    candidates: tuple[Candidate, ...] = ()
    note: str = ""
    reference_text: str = ""
    compared_text: str = ""
    lower_bound: bool = False

    def context(self, width: int = 24) -> str:
        """The decoded text around the divergence on both sides."""
        ref, cmp = self.reference_text, self.compared_text
        common = 0
        while common < min(len(ref), len(cmp)) and ref[common] == cmp[common]:
            common += 1
        return (f"…{ref[max(0, common - width):common]!r} then reference {ref[common:common + width]!r} vs "
                f"compared {cmp[common:common + width]!r}")

    def describe(self) -> str:
        ref = list(self.reference_ids[max(0, self.index - 3) : self.index + 3])
        cmp = list(self.compared_ids[max(0, self.index - 3) : self.index + 3])
        facts: list[str] = [self.kind]
        if self.top12 is not None:
            facts.append(f"top-1/top-2 gap {self.top12:.3g}")
        if self.gap is not None:
            facts.append(f"diverging token {'>' if self.lower_bound else ''}{self.gap:.3g} below the "
                         "top logprob")
        shown = ", ".join(f"{c.token}{'' if c.text is None else f' {c.text!r}'}: {c.logprob:.6g}"
                          for c in self.candidates[:3])
        text = (f"{self.prompt[:40]!r}: diverges at token {self.index} ({', '.join(facts)}): "
                f"reference …{ref}… vs compared …{cmp}…")
        if shown:
            text += f"; plain server's top logprobs there: {shown}"
        if self.note:
            text += f"; {self.note}"
        if self.reference_text or self.compared_text:
            text += f"\n      text: {self.context()}"
        return text


@dataclass
class ParityReport:
    prompts: int = 0
    exact: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    tie_gap: float = DEFAULT_TIE_GAP
    max_tie_rate: float = DEFAULT_MAX_TIE_RATE
    label: str = ""
    plain: str | None = None
    concurrent: bool = False
    noise_gap: float = DEFAULT_NOISE_GAP

    @property
    def exact_rate(self) -> float:
        return self.exact / self.prompts if self.prompts else 0.0

    @property
    def real(self) -> list[Divergence]:
        """Divergences that are not numerical (real ones and untriaged ones): each is a failure."""
        return [d for d in self.divergences if d.kind not in ("tie", "noise")]

    @property
    def ties(self) -> list[Divergence]:
        """Numerical divergences: exact ties, and near-ties moved by kernel numerics (kind "noise")."""
        return [d for d in self.divergences if d.kind in ("tie", "noise")]

    @property
    def tie_rate(self) -> float:
        return len(self.ties) / self.prompts if self.prompts else 0.0

    def problems(self) -> list[str]:
        """Why this comparison fails (empty: it passes)."""
        out = [d.describe() for d in self.real]
        if self.tie_rate > self.max_tie_rate:
            out.append(f"{len(self.ties)} of {self.prompts} prompts diverged at numerical ties or noise: tie "
                       f"rate {self.tie_rate:.2f} > max_tie_rate {self.max_tie_rate:g}")
        return out

    def summary(self) -> str:
        kinds = {k: sum(1 for d in self.divergences if d.kind == k)
                 for k in ("real", "tie", "noise", "unknown")}
        batch = f", {kinds['noise']} numerical noise (noise_gap {self.noise_gap:g})"
        return (f"{self.label}: {self.exact}/{self.prompts} prompts token-identical (exact-match rate "
                f"{self.exact_rate:.2f}); divergences: {kinds['real']} real, {kinds['tie']} ties (tie_gap "
                f"{self.tie_gap:g}, max_tie_rate {self.max_tie_rate:g}){batch}, {kinds['unknown']} untriaged"
                + (f"; triage by {self.plain}" if self.plain else "; no plain server for triage"))

    def check(self) -> None:
        """Raise AssertionError with the summary and every problem (real / untriaged divergences,
        tie rate)."""
        __tracebackhide__ = True
        problems = self.problems()
        if problems:
            raise AssertionError(self.summary() + "\n  " + "\n  ".join(problems))

    def as_fact(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts, "exact": self.exact, "exact_rate": round(self.exact_rate, 4),
            "ties": sum(d.kind == "tie" for d in self.divergences),
            "real": sum(d.kind == "real" for d in self.divergences),
            "noise": sum(d.kind == "noise" for d in self.divergences), "concurrent": self.concurrent,
            "unknown": sum(d.kind == "unknown" for d in self.divergences),
            "tie_rate": round(self.tie_rate, 4),
            "tie_gap": self.tie_gap, "max_tie_rate": self.max_tie_rate, "plain": self.plain,
            "divergences": [{"prompt": d.prompt[:60], "index": d.index, "kind": d.kind, "gap": d.gap,
                             "top12": d.top12} for d in self.divergences],
        }


# ---- the plain server's view ------------------------------------------------------------------------


@dataclass
class PlainView:
    """A plain server's greedy output with its top logprobs at every position."""

    ids: list[int]
    top: list[tuple[Candidate, ...]]


class PlainServer:
    """Reads top logprobs from a non-speculative SGLang server."""

    def __init__(self, client: InferenceClient, *, top: int = TOP_LOGPROBS) -> None:
        self.client = client
        self.top = top

    def _post(self, body: dict[str, Any]) -> Answer:
        response = self.client.request("POST", "/generate", json_body=body)
        if response.status_code >= 400:
            raise ApiError(self.client.service, "/generate", response.status_code, "return_logprob refused",
                           response.text[:300])
        return whole_answer(answer_json(response, self.client.service, "/generate"), "generate",
                            self.client.service)

    def greedy(self, prompt: str | Sequence[int], tokens: int) -> PlainView:
        body: dict[str, Any] = {
            "sampling_params": {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": self.top, "return_text_in_logprobs": True,
        }
        body["text" if isinstance(prompt, str) else "input_ids"] = (prompt if isinstance(prompt, str)
                                                                    else list(prompt))
        answer = self._post(body)
        return PlainView([int(i) for i in answer.output_ids or ()],
                         [tuple(Candidate(e.logprob, e.token, e.text) for e in step)
                          for step in answer.top_logprobs or ()])

    def prompt_ids(self, prompt: str) -> list[int] | None:
        """The prompt's token ids, where the server reports input logprobs (logprob_start_len = 0)."""
        body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                "return_logprob": True, "logprob_start_len": 0}
        try:
            ids = self._post(body).input_ids
        except ApiError:
            return None
        return list(ids) if ids is not None else None


def triage(plain: PlainServer, prompt: str, reference: Sequence[int], compared: Sequence[int], index: int,
           tie_gap: float) -> Triage:
    """Classify the first divergence (at `index`) of two greedy outputs of `prompt`."""
    ref_token = reference[index] if index < len(reference) else None
    cmp_token = compared[index] if index < len(compared) else None
    try:
        view = plain.greedy(prompt, index + 1)
    except ApiError as exc:
        return Triage("unknown", note=f"the plain server could not be asked: {exc}")
    own = first_divergence(view.ids[:index], reference[:index])
    if own is None and len(view.top) > index:
        return classify(ref_token, cmp_token, view.top[index], tie_gap)
    if own is None:
        return Triage("unknown", note=f"the plain server returned top logprobs for {len(view.top)} "
                                      "positions only")
    # The reference itself left the target's greedy path at `own`: triage that first.
    departure = classify(reference[own], view.ids[own], view.top[own] if own < len(view.top) else (), tie_gap)
    where = f"the reference itself departs from the plain server's greedy output at token {own}"
    if departure.kind != "tie":
        gap = "" if departure.gap is None else f", gap {departure.gap:.3g}"
        return replace(departure, note=f"{where} ({departure.kind}{gap})")
    prompt_ids = plain.prompt_ids(prompt)
    if prompt_ids is None:
        return Triage("unknown", note=f"{where} (a tie), and the server reports no prompt token ids to "
                                      f"re-read token {index} with the reference's prefix")
    try:
        forced = plain.greedy([*prompt_ids, *reference[:index]], 1)
    except ApiError as exc:
        return Triage("unknown", note=f"{where} (a tie); teacher forcing failed: {exc}")
    if not forced.top:
        return Triage("unknown", note=f"{where} (a tie); teacher forcing returned no logprobs")
    result = classify(ref_token, cmp_token, forced.top[0], tie_gap)
    return replace(result, note=f"{where} (a tie); read by teacher forcing on the reference's prefix")


def greedy_outputs(client: InferenceClient, prompts: Sequence[Prompt], *, max_tokens: int,
                   concurrent_requests: bool = False) -> list[Generation]:
    """Greedy generations (ignore_eos) of every prompt, one at a time or all at once."""
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if not concurrent_requests:
        outputs = [client.generate(p.text, sampling) for p in prompts]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts),
                                                   thread_name_prefix="dflash-parity") as pool:
            outputs = list(pool.map(lambda p: client.generate(p.text, sampling), prompts))
    for prompt, output in zip(prompts, outputs, strict=True):
        if max_tokens > 0 and not output.output_ids:
            # parity compares token ids: two answers without them would be "identical" having compared nothing
            raise ApiError(client.service, "/generate", 200, f"the answer to {prompt.name!r} carries no "
                           "output_ids (a list of token ids): greedy parity compares token ids",
                           output.text[:200])
    return outputs


def compare_greedy(
    reference: InferenceClient,
    compared: InferenceClient,
    prompts: Sequence[str | Prompt],
    *,
    max_tokens: int = 32,
    plain: InferenceClient | None = None,
    tie_gap: float = DEFAULT_TIE_GAP,
    max_tie_rate: float = DEFAULT_MAX_TIE_RATE,
    concurrent_requests: bool = False,
    reference_outputs: Sequence[Generation] | None = None,
    plain_unavailable: str = "no plain (non-speculative) server to read top logprobs from",
) -> ParityReport:
    """Greedy token ids of `compared` vs `reference` on each prompt, first divergences triaged
    through `plain`.

    `concurrent_requests` sends the compared service all prompts at once (a batch, as the H200 record's
    divergences happened in). `reference_outputs` reuses outputs already fetched for these prompts.
    """
    items = [p if isinstance(p, Prompt) else Prompt(p[:24], p) for p in prompts]
    report = ParityReport(tie_gap=tie_gap, max_tie_rate=max_tie_rate, label=f"{reference.service} vs "
                          f"{compared.service}", plain=plain.service if plain else None)
    refs = list(reference_outputs) if reference_outputs is not None else greedy_outputs(
        reference, items, max_tokens=max_tokens)
    cmps = greedy_outputs(compared, items, max_tokens=max_tokens, concurrent_requests=concurrent_requests)
    server = PlainServer(plain) if plain is not None else None
    for prompt, ref, cmp in zip(items, refs, cmps, strict=True):
        report.prompts += 1
        ref_ids, cmp_ids = tuple(ref.output_ids or ()), tuple(cmp.output_ids or ())
        index = first_divergence(ref_ids, cmp_ids)
        if index is None:
            report.exact += 1
            continue
        verdict = (triage(server, prompt.text, ref_ids, cmp_ids, index, tie_gap) if server is not None
                   else Triage("unknown", note=plain_unavailable))
        report.divergences.append(Divergence(
            prompt.text, index, ref_ids, cmp_ids, verdict.gap, verdict.kind, verdict.top12,
            verdict.candidates, verdict.note, ref.text, cmp.text, verdict.lower_bound))
    return report


def compare_pair(reference: ServiceHandle, compared: ServiceHandle, prompts: Sequence[str | Prompt], *,
                 max_tokens: int = 32, tie_gap: float | None = None, max_tie_rate: float | None = None,
                 concurrent_requests: bool = False, plain_port: int | None = None,
                 reference_outputs: Sequence[Generation] | None = None,
                 compared_alone: Sequence[Generation] | None = None,
                 noise_gap: float | None = None) -> ParityReport:
    """compare_greedy for two services of one host; the plain server is found (or started) only for a
    divergence.

    A near-tie divergence (within `noise_gap`) is checked against the compared service's own output for the
    prompt sent alone (`compared_alone` when given, else one more request): when that output has the
    reference's token there, the divergence is numerical noise, counted with ties.
    """
    spec = reference.host.profile.parity
    gap = tie_gap if tie_gap is not None else (spec.tie_gap if spec else DEFAULT_TIE_GAP)
    rate = max_tie_rate if max_tie_rate is not None else (spec.max_tie_rate if spec else DEFAULT_MAX_TIE_RATE)
    noise = noise_gap if noise_gap is not None else (spec.noise_gap if spec else DEFAULT_NOISE_GAP)
    first = compare_greedy(reference.client, compared.client, prompts, max_tokens=max_tokens, plain=None,
                           tie_gap=gap, max_tie_rate=rate, concurrent_requests=concurrent_requests,
                           reference_outputs=reference_outputs)
    first.concurrent, first.noise_gap = concurrent_requests, noise
    if not first.divergences:
        return first
    client, why = ready_plain(reference, port=plain_port)
    if client is None:
        first.divergences = [replace(d, note=why) for d in first.divergences]
        return first
    server = PlainServer(client)
    first.plain = client.service
    first.divergences = [_retriaged(d, triage(server, d.prompt, d.reference_ids, d.compared_ids,
                                              d.index, gap))
                         for d in first.divergences]
    alone = {_prompt_text(p): tuple(g.output_ids or ())
             for p, g in zip(prompts, compared_alone or (), strict=False)}

    def again(divergence: Divergence) -> tuple[int, ...]:
        if divergence.prompt in alone:
            return alone[divergence.prompt]
        sampling = Sampling(max_tokens=len(divergence.compared_ids), temperature=0.0, ignore_eos=True)
        return tuple(compared.client.generate(divergence.prompt, sampling).output_ids or ())

    first.divergences = [numerical_noise(d, again(d) if _near_tie(d, noise) else None, noise)
                         for d in first.divergences]
    return first


def check_slice(reference: ServiceHandle, compared: ServiceHandle, prompts: Sequence[str | Prompt],
                options: LayerOptions, *, max_tokens: int = 32) -> ParityReport:
    """compare_pair on a few prompts with the run's thresholds (tie_gap, max_tie_rate, noise_gap: the options,
    else the profile's [parity] table), recorded in the verdict's metrics, then checked: real or untriaged
    divergences fail, and so does a tie rate above max_tie_rate (the smoke suite's slice of the parity
    layer)."""
    __tracebackhide__ = True
    report = compare_pair(reference, compared, prompts, max_tokens=max_tokens, tie_gap=options.tie_gap,
                          max_tie_rate=options.max_tie_rate, noise_gap=options.noise_gap,
                          plain_port=options.plain_port)
    metrics: dict[str, Any] = reference.host.facts.metrics
    metrics[f"parity-slice:{reference.name}~{compared.name}"] = report.as_fact()
    report.check()
    return report


def _prompt_text(prompt: str | Prompt) -> str:
    return prompt.text if isinstance(prompt, Prompt) else prompt


def _near_tie(divergence: Divergence, noise_gap: float) -> bool:
    return (divergence.kind == "real" and not divergence.lower_bound and divergence.gap is not None
            and divergence.gap <= noise_gap)


def numerical_noise(divergence: Divergence, again: tuple[int, ...] | None, noise_gap: float) -> Divergence:
    """Reclassify a near-tie divergence as numerical noise when the service, asked again alone, agrees.

    Only when (a) the diverging token is within `noise_gap` nats of the plain server's top logprob, and (b)
    the compared service's own output for the prompt sent again alone (`again`) has the reference's token at
    the divergence. A lossy verifier repeats its wrong token; a batching bug (KV mixed up across requests)
    picks tokens at confident positions: both stay real.
    """
    if again is None or not _near_tie(divergence, noise_gap):
        return divergence
    index = divergence.index
    if len(again) <= index or index >= len(divergence.reference_ids):
        return divergence
    if tuple(again[: index + 1]) != tuple(divergence.reference_ids[: index + 1]):
        return divergence
    return replace(divergence, kind="noise", note=NOISE_NOTE)


def _retriaged(divergence: Divergence, verdict: Triage) -> Divergence:
    return replace(divergence, kind=verdict.kind, gap=verdict.gap, top12=verdict.top12,
                   candidates=verdict.candidates, note=verdict.note, lower_bound=verdict.lower_bound)


__all__ = ["SMOKE_PROMPTS", "Candidate", "Divergence", "ParityReport", "PlainServer",
           "Triage", "check_slice", "classify", "compare_greedy", "compare_pair", "first_divergence",
           "greedy_outputs", "numerical_noise", "triage"]
