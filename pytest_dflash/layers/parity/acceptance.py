"""Accept length: how many tokens a speculative server emits per verify step, per request and on average.

SGLang's definition: accept length = completion_tokens / spec_verify_ct (the bonus token counted,
the prefill token included), per request in ``meta_info``. Older builds lack the per-request
fields; then the server-wide ``/server_info`` ``internal_states[0].avg_spec_accept_length`` is read
after a ``/flush_cache`` (which resets it) and the prompts run one at a time. ``/flush_cache`` changes the
server's state: on a server this run did not start it is sent only when the user allowed it
(``--allow-state-changes``); otherwise the fallback is refused with `FlushRefused`.

A speculative service must really accept drafts: its mean accept length must be at least the profile's
``[floors.SERVICE] accept_length``, else at least `DEFAULT_MIN_ACCEPT_LENGTH` (1.1: a draft accepted on one
verify step in ten). A service whose profile declares ``unaccepted_draft = "why"`` (a random draft on a test
pair) only has to emit at least one token per verify step. A speculative server that reports no accept length
at all (no ``spec_*`` field in meta_info, none in /server_info) fails: it is not speculating.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling

Source = Literal["meta_info", "server_info"]
# without [floors.SERVICE] accept_length: drafts accepted, not speculation in name
DEFAULT_MIN_ACCEPT_LENGTH = 1.1
LIKELY_CAUSES = ("a draft model that does not match the target (another model family, tokenizer or "
                 "revision), a random or untrained draft, or speculation disabled by a fallback or a setting "
                 "the server changed at start-up (see the service's log and "
                 "test_serves_the_profiles_speculation)")


@dataclass(frozen=True)
class Floor:
    """The minimum mean accept length a service must reach, and where it comes from."""

    value: float
    where: str
    unaccepted_draft: str | None = None  # the profile's reason for a draft that cannot be accepted


def required_floor(service: str, floors: Mapping[str, float | str], *, unaccepted_draft: str | None,
                   source: str) -> Floor:
    """[floors.SERVICE] accept_length when set; else 1 for a declared `unaccepted_draft`; else the default."""
    raw = floors.get("accept_length")
    if isinstance(raw, int | float):
        return Floor(float(raw), f"[floors.{service}] accept_length of {source}", unaccepted_draft)
    if unaccepted_draft is not None:
        return Floor(1.0, f"[services.{service}] unaccepted_draft of {source}: {unaccepted_draft}",
                     unaccepted_draft)
    return Floor(DEFAULT_MIN_ACCEPT_LENGTH,
                 f"the default minimum for a speculative service (set [floors.{service}] "
                 "accept_length, or unaccepted_draft for a draft that cannot be accepted)")


class AcceptanceUnavailable(AssertionError):
    """The server reports no accept length at all (per request or server-wide)."""


class FlushRefused(Exception):
    """The accept length needs a /flush_cache that this run may not send (an attached server, no opt-in).

    Not an AssertionError: nothing was measured, so the caller skips with the reason instead of failing.
    """


@dataclass
class Acceptance:
    """Accept lengths of one service on one prompt set."""

    service: str
    source: Source
    prompts: int
    tokens: int = 0
    steps: int = 0
    per_request: list[float] = field(default_factory=list)
    server_mean: float | None = None  # server_info fallback: SGLang's own average
    # category -> [tokens, verify steps, prompts]
    by_category: dict[str, list[int]] = field(default_factory=dict)
    accepted_drafts: int = 0  # spec_num_correct_drafts summed (meta_info, when reported)
    proposed_drafts: int = 0  # spec_num_proposed_drafts summed
    max_tokens: int = 0  # what each request allowed (0: not recorded)
    largest: int = 0  # the most completion tokens one request reported

    @property
    def accept_rate(self) -> float | None:
        """Accepted / proposed draft tokens (None: the server reports no draft counts)."""
        return self.accepted_drafts / self.proposed_drafts if self.proposed_drafts else None

    def describe(self) -> str:
        """'accept length 1.016 on 4 greedy prompts (meta_info; 260 tokens in 256 verify steps, accept rate
        0.00)'."""
        rate = f", accept rate {self.accept_rate:.3f}" if self.accept_rate is not None else ""
        steps = f" in {self.steps} verify steps" if self.steps else ""
        return (f"accept length {self.mean:.3f} on {self.prompts} greedy prompts ({self.source}; "
                f"{self.tokens} tokens{steps}{rate})")

    @property
    def per_category(self) -> dict[str, float]:
        """Tokens per verify step of each prompt category (meta_info only: the server-wide average
        has none)."""
        return {name: round(tokens / steps, 4)
                for name, (tokens, steps, _) in sorted(self.by_category.items())
                if steps}

    def describe_categories(self) -> str:
        """'chat 2.31, code 3.05, …' (empty without categories)."""
        return ", ".join(f"{name} {value:.2f}" for name, value in self.per_category.items())

    @property
    def mean(self) -> float:
        """Tokens per verify step over all requests (SGLang's average: weighted by steps)."""
        if self.server_mean is not None:
            return self.server_mean
        return self.tokens / self.steps if self.steps else 0.0

    def as_fact(self) -> dict[str, Any]:
        fact: dict[str, Any] = {"mean": round(self.mean, 4), "source": self.source, "prompts": self.prompts,
                                "tokens": self.tokens, "verify_steps": self.steps,
                                "per_request": [round(v, 3) for v in self.per_request]}
        if self.accept_rate is not None:
            fact["accept_rate"] = round(self.accept_rate, 4)
        if self.per_category:
            fact["per_category"] = self.per_category
            fact["prompts_per_category"] = {name: counts[2]
                                            for name, counts in sorted(self.by_category.items())}
        return fact


def _per_request(meta: Mapping[str, Any]) -> tuple[int, int] | None:
    steps = meta.get("spec_verify_ct")
    tokens = meta.get("completion_tokens")
    if isinstance(steps, int | float) and isinstance(tokens, int | float) and steps > 0:
        return int(tokens), int(steps)
    return None


def _flush(client: InferenceClient, *, deadline_s: float = 15.0) -> None:
    """/flush_cache until it is accepted (it answers 400 while requests run)."""
    deadline = time.monotonic() + deadline_s
    while True:
        status = client.flush_cache(timeout_s=10)
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise AcceptanceUnavailable(f"{client.service}: /flush_cache kept answering {status} for "
                                        f"{deadline_s:g}s (requests running?); cannot reset the server-wide "
                                        "accept length")
        time.sleep(0.2)


def _reports_server_mean(client: InferenceClient) -> bool:
    """/server_info has the server-wide accept length field at all (any value): reading it changes nothing."""
    states = (client.server_info() or {}).get("internal_states")
    return isinstance(states, list) and bool(states) and isinstance(states[0], dict) \
        and "avg_spec_accept_length" in states[0]


def _server_mean(client: InferenceClient) -> float | None:
    info = client.server_info() or {}
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return None


def measure(client: InferenceClient, prompts: Sequence[str], *, max_tokens: int = 64,
            timeout_s: float | None = None, flush_refused: str | None = None,
            categories: Sequence[str | None] | None = None) -> Acceptance:
    """Greedy generations of `prompts`; accept length per request from meta_info, else from /server_info.

    `categories` (one per prompt, None: uncategorised) groups the per-request numbers:
    `Acceptance.per_category`.

    `flush_refused`: why /flush_cache may not be sent (None: it may). The /server_info fallback needs it (the
    server-wide average is cumulative since the last flush), so it raises `FlushRefused` before sending one.
    """
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    result = Acceptance(client.service, "meta_info", len(prompts), max_tokens=max_tokens)
    if categories is not None and len(categories) != len(prompts):
        raise ValueError(f"{len(categories)} categories for {len(prompts)} prompts")
    missing = False
    for index, prompt in enumerate(prompts):
        gen = client.generate(prompt, sampling, timeout_s=timeout_s)
        counts = _per_request(gen.meta)
        if counts is None:
            missing = True
            break
        tokens, steps = counts
        result.tokens += tokens
        result.steps += steps
        result.largest = max(result.largest, tokens)
        correct, proposed = gen.meta.get("spec_num_correct_drafts"), gen.meta.get("spec_num_proposed_drafts")
        if isinstance(correct, int | float) and isinstance(proposed, int | float):
            result.accepted_drafts += int(correct)
            result.proposed_drafts += int(proposed)
        result.per_request.append(tokens / steps)
        category = categories[index] if categories is not None else None
        if category is not None:
            entry = result.by_category.setdefault(category, [0, 0, 0])
            entry[0] += tokens
            entry[1] += steps
            entry[2] += 1
    if not missing:
        return result
    # No per-request fields (older SGLang): the server-wide average since a flush, prompts one at a time.
    if not _reports_server_mean(client):
        raise AcceptanceUnavailable(
            f"{client.service}: no accept length: meta_info has no spec_verify_ct (no spec_* field) and "
            "/server_info has no internal_states[0].avg_spec_accept_length: the server is not speculating, "
            f"though its profile says it does. Likely causes: {LIKELY_CAUSES}")
    if flush_refused is not None:
        raise FlushRefused(f"{client.service}: meta_info has no per-request accept length (spec_verify_ct), "
                           f"and the server-wide average needs a /flush_cache first: {flush_refused}")
    result = Acceptance(client.service, "server_info", len(prompts))
    _flush(client)
    for prompt in prompts:
        gen = client.generate(prompt, sampling, timeout_s=timeout_s)
        result.tokens += gen.completion_tokens or 0
    result.server_mean = _server_mean(client)
    if result.server_mean is None:
        raise AcceptanceUnavailable(
            f"{client.service}: no accept length: meta_info has no spec_verify_ct and /server_info has no "
            "internal_states[0].avg_spec_accept_length (is this a speculative server?)")
    return result


def check_at_least_one(acceptance: Acceptance) -> None:
    """Every verify step emits at least the bonus token: an accept length below 1 is an accounting bug."""
    __tracebackhide__ = True
    if acceptance.mean < 1.0:
        raise AssertionError(f"{acceptance.service}: accept length {acceptance.mean:.3f} < 1 "
                             f"({acceptance.source}): a verify step emits at least one token")


def over_block(tokens: int, steps: int, block: int | None, prompts: int = 1) -> bool:
    """More tokens than `steps` verify steps of `block` (speculative_num_draft_tokens) tokens can emit, the
    prefill's one token per prompt aside; False where the block or the steps are not known."""
    return bool(block) and steps > 0 and tokens > steps * (block or 0) + prompts


def check_accounting(acceptance: Acceptance, block: int | None) -> None:
    """The counts an accept length is computed from are possible: no request reports more completion tokens
    than it allowed, and no verify step emits more than the `block` (speculative_num_draft_tokens) tokens it
    verifies (the prefill's token aside, one per request). A server that over-counts tokens or under-counts
    verify steps would otherwise pass any accept-length floor."""
    __tracebackhide__ = True
    if acceptance.max_tokens and acceptance.largest > acceptance.max_tokens:
        raise AssertionError(f"{acceptance.service}: a request of at most {acceptance.max_tokens} tokens "
                             f"reports {acceptance.largest} completion tokens ({acceptance.source}): the "
                             "counts its accept length is computed from cannot be trusted")
    if over_block(acceptance.tokens, acceptance.steps, block, acceptance.prompts):
        raise AssertionError(f"{acceptance.service}: {acceptance.tokens} tokens in {acceptance.steps} verify "
                             f"steps on {acceptance.prompts} prompts (accept length {acceptance.mean:.3f}) "
                             f"is more than steps of {block} draft tokens can emit: the server miscounts its "
                             "tokens or its verify steps (spec_verify_ct)")


def check_floor(acceptance: Acceptance, floor: float | None, *, where: str = "") -> None:
    """The mean accept length is at least `floor` (the profile's accept_length); without a floor, at least 1.

    A point estimate on a few greedy prompts (deterministic for a given server): the smoke suite's check. The
    perf suite bounds the same number over many requests.
    """
    __tracebackhide__ = True
    if floor is None:
        check_at_least_one(acceptance)
        return
    if acceptance.mean < floor:
        per_request = (f"; per request {[round(v, 2) for v in acceptance.per_request]}"
                       if acceptance.per_request else "")
        raise AssertionError(
            f"{acceptance.service}: accept length {acceptance.mean:.3f} < floor "
            f"{floor:g}{where and f' ({where})'} on {acceptance.prompts} greedy prompts "
            f"({acceptance.source}; {acceptance.tokens} "
            f"tokens{f' in {acceptance.steps} verify steps' if acceptance.steps else ''}){per_request}: the "
            "draft model is accepted less often than this host's profile requires (a wrong or mismatched "
            "draft model, --speculative-num-draft-tokens, or a verifier that rejects good drafts)")


def check_accepts_drafts(acceptance: Acceptance, floor: Floor, *, block: int | None = None) -> None:
    """The mean accept length reaches `floor` (see `required_floor`): the drafts are really accepted, counted
    by possible numbers (`check_accounting`; `block`: the server's speculative_num_draft_tokens, where known).

    The failure names the numbers and the likely causes; a server reporting accept rate 0 says so."""
    __tracebackhide__ = True
    check_at_least_one(acceptance)
    check_accounting(acceptance, block)
    rate_zero = acceptance.accept_rate == 0.0 and acceptance.proposed_drafts > 0
    if acceptance.mean >= floor.value:
        return
    per_request = (f"; per request {[round(v, 2) for v in acceptance.per_request]}"
                   if acceptance.per_request else "")
    zero = (f" The server reports accept rate 0 ({acceptance.accepted_drafts} of "
            f"{acceptance.proposed_drafts} draft tokens accepted).") if rate_zero else ""
    if acceptance.mean < DEFAULT_MIN_ACCEPT_LENGTH:  # not clearly above 1: speculation that does not happen
        raise AssertionError(
            f"{acceptance.service}: no speculation in practice: {acceptance.describe()} < {floor.value:g} "
            f"required by {floor.where}{per_request}.{zero} Every verify step costs a draft and a wider "
            f"target pass, so this service is slower than plain decoding. Likely causes: {LIKELY_CAUSES}. A "
            "test pair that knowingly serves a draft that cannot be accepted says so: [services.NAME] "
            "unaccepted_draft = \"why\" (docs/profiles.md)")
    raise AssertionError(
        f"{acceptance.service}: drafts accepted less often than required: {acceptance.describe()} < "
        f"{floor.value:g} required by {floor.where}{per_request}. Likely causes: a draft model that does not "
        "match the target well (another fine-tune or revision), --speculative-num-draft-tokens / the tree "
        "budget, prompts unlike the draft's training data, or a verifier that rejects good drafts")


def check_ddtree_vs_dflash(ddtree: Acceptance, dflash: Acceptance, *, ratio: float) -> None:
    """DDTREE's mean accept length must be at least `ratio` x DFLASH's on the same prompts."""
    __tracebackhide__ = True
    if ddtree.mean < ratio * dflash.mean:
        raise AssertionError(
            f"DDTREE accepts less than {ratio:g} x DFLASH on the same {ddtree.prompts} prompts: "
            f"{ddtree.service} {ddtree.mean:.3f} vs {dflash.service} {dflash.mean:.3f} tokens per verify "
            f"step (ratio {ddtree.mean / dflash.mean if dflash.mean else float('inf'):.3f}); per request "
            f"DDTREE {[round(v, 2) for v in ddtree.per_request]} vs DFLASH "
            f"{[round(v, 2) for v in dflash.per_request]}"
        )


__all__ = ["DEFAULT_MIN_ACCEPT_LENGTH", "LIKELY_CAUSES", "Acceptance", "AcceptanceUnavailable", "Floor",
           "FlushRefused", "check_accepts_drafts", "check_accounting", "check_at_least_one",
           "check_ddtree_vs_dflash", "check_floor", "measure", "over_block", "required_floor"]
