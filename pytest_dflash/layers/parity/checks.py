"""The parity layer's checks as the suites call them: one function per suite test (suites/parity/).

Each takes the fixtures a test gets (the service pair or service, the layer options, the run's cache), skips
with the reason where the check cannot apply, records its numbers in the verdict (host.facts.metrics) and
fails with the report's own message. The comparisons themselves live in greedy.py, distribution.py and
acceptance.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_dflash.layers.generation.seeds import GREEDY_FALLBACK_LINE, service_log_line
from pytest_dflash.layers.parity import acceptance
from pytest_dflash.layers.parity import greedy as parity
from pytest_dflash.layers.parity.distribution import DrawPlan, Sample, compare_distributions
from pytest_dflash.layers.parity.hooks import (
    DISTRIBUTION_PROMPTS,
    LayerOptions,
    state_change_refusal,
)
from pytest_dflash.load.workload import SHIPPED_DATASET, DatasetPrompt, load_dataset, sample_by_category
from pytest_dflash.run import skips
from pytest_dflash.run.fixtures import ready_or_blocked

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

Pair = tuple["ServiceHandle", "ServiceHandle"]
Cache = dict[tuple[str, ...], Any]

# Accept length is measured on a seeded sample of the shipped prompt set (pytest_dflash/data/prompts.jsonl),
# spread evenly over its categories (chat, code, math, multilingual, summarisation): few requests, a number
# per category.
ACCEPTANCE_SAMPLE = 16
ACCEPTANCE_SEED = 0


def acceptance_prompts(total: int = ACCEPTANCE_SAMPLE, *, seed: int = ACCEPTANCE_SEED) -> list[DatasetPrompt]:
    """The accept-length prompts: `total` of the shipped set, the same ones on every run (seeded)."""
    return sample_by_category(load_dataset(SHIPPED_DATASET), total, seed=seed)


def require_native(pair: Sequence[ServiceHandle]) -> None:
    """Skip unless every service serves SGLang's native /generate (parity compares token ids)."""
    for service in pair:
        skips.needs_sglang(service, f"parity compares token ids: {service.label} does not serve SGLang's "
                                    "native /generate")


def greedy_parity(pair: Pair, options: LayerOptions, cache: Cache, *,
                  concurrent_requests: bool) -> parity.ParityReport:
    """Greedy outputs of the compared service against the reference's, triaged at ties; recorded,
    then checked.

    The reference's outputs (and, for the concurrent variant, the compared service's outputs alone) are
    computed once per run and shared by both tests."""
    __tracebackhide__ = True
    require_native(pair)
    reference, compared = pair
    spec = reference.host.profile.parity
    prompts = options.prompts(spec.prompts if spec else None)

    def alone(service: ServiceHandle) -> Any:
        key = ("greedy", service.host.name, service.name, str(options.max_tokens), *(p.text for p in prompts))
        if key not in cache:
            cache[key] = parity.greedy_outputs(service.client, prompts, max_tokens=options.max_tokens)
        return cache[key]

    report = parity.compare_pair(reference, compared, prompts, max_tokens=options.max_tokens,
                                 tie_gap=options.tie_gap, max_tie_rate=options.max_tie_rate,
                                 plain_port=options.plain_port, concurrent_requests=concurrent_requests,
                                 reference_outputs=alone(reference),
                                 compared_alone=alone(compared) if concurrent_requests else None,
                                 noise_gap=options.noise_gap)
    kind = "parity-concurrent" if concurrent_requests else "parity"
    reference.host.facts.metrics[f"{kind}:{reference.name}~{compared.name}"] = report.as_fact()
    report.check()
    return report


def reference_samples(cache: Cache, host: str, service: str, plan: DrawPlan) -> dict[str, list[Sample]]:
    """The per-prompt sample cache of one reference service under one draw plan."""
    key = ("samples", host, service, repr(plan))
    samples: dict[str, list[Sample]] = cache.setdefault(key, {})
    return samples


def distribution_parity(pair: Pair, options: LayerOptions, cache: Cache) -> None:
    """Sampled first-K-token distributions of the pair compared (chi-square); a failure quotes a
    greedy-fallback line from either service's log when there is one (the usual cause: a verifier that ignores
    temperature)."""
    __tracebackhide__ = True
    require_native(pair)
    reference, compared = pair
    samples = reference_samples(cache, reference.host.name, reference.name, options.draw)
    report = compare_distributions(reference.client, compared.client, DISTRIBUTION_PROMPTS, options.draw,
                                   alpha=options.alpha, min_samples=options.min_samples,
                                   reference_samples=samples)
    reference.host.facts.metrics[f"distribution:{reference.name}~{compared.name}"] = report.as_fact()
    evidence = ""
    if report.outcome == "fail":
        for service in (compared, reference):
            line = service_log_line(service, GREEDY_FALLBACK_LINE)
            if line:
                evidence += f"{service.label}'s log says: {line}\n"
    report.check(evidence=evidence.strip(), min_samples=options.min_samples)


def measure_acceptance(handle: ServiceHandle, prompts: Sequence[str], *, max_tokens: int, allowed: bool,
                       categories: Sequence[str | None] | None = None) -> acceptance.Acceptance:
    """acceptance.measure on `handle`, recorded in the verdict (per category too, and as a note on the
    terminal summary); skipped (naming the option) when it needs a /flush_cache this run may not send."""
    try:
        result = acceptance.measure(handle.client, prompts, max_tokens=max_tokens,
                                    flush_refused=state_change_refusal(handle, allowed=allowed),
                                    categories=categories)
    except acceptance.FlushRefused as exc:
        skips.could_not_check(f"accept length not measured: {exc}")
    handle.host.facts.accept_lengths[handle.name] = round(result.mean, 4)
    handle.host.facts.metrics[f"acceptance:{handle.name}"] = result.as_fact()
    if result.per_category:
        handle.host.notes.append(f"{handle.name}: accept length per category ({result.prompts} greedy "
                                 f"prompts, {max_tokens} tokens each): {result.describe_categories()}")
    return result


def _acceptance(service: ServiceHandle, options: LayerOptions, cache: Cache) -> acceptance.Acceptance:
    """The service's accept length on a seeded sample of the shipped prompt set (and --parity-prompts), per
    category too, measured once per run."""
    skips.needs_sglang(service, "accept length needs SGLang's native /generate meta_info or /server_info")
    sample = acceptance_prompts()
    prompts = [*(p.prompt for p in sample), *(p.text for p in options.extra_prompts)]
    categories = [*(p.category for p in sample), *(p.category for p in options.extra_prompts)]
    key = ("acceptance", service.host.name, service.name, str(options.max_tokens), *prompts)
    if key not in cache:
        cache[key] = measure_acceptance(service, prompts, max_tokens=options.max_tokens,
                                        allowed=options.allow_state_changes, categories=categories)
    measured: acceptance.Acceptance = cache[key]
    return measured


def required_floor(service: ServiceHandle) -> acceptance.Floor:
    """The service's minimum mean accept length: [floors.SERVICE] accept_length, 1 for a declared
    unaccepted_draft, else acceptance.DEFAULT_MIN_ACCEPT_LENGTH."""
    profile = service.host.profile
    return acceptance.required_floor(service.name, profile.floors.get(service.name, {}),
                                     unaccepted_draft=service.spec.unaccepted_draft,
                                     source=str(profile.source))


def draft_block(service: ServiceHandle) -> int | None:
    """The most tokens one verify step can emit: the server's speculative_num_draft_tokens (/server_info), or
    None where it does not say."""
    value = (service.server_info or {}).get("speculative_num_draft_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _speculative_or_skip(service: ServiceHandle) -> None:
    if service.algorithm == "NONE":  # an attached server says what it runs only in /server_info
        skips.not_applicable(f"{service.label} does not use speculative decoding")


def accept_length(service: ServiceHandle, options: LayerOptions, cache: Cache) -> acceptance.Acceptance:
    """The service's mean accept length, measured and checked to reach its floor (`required_floor`)."""
    __tracebackhide__ = True
    _speculative_or_skip(service)
    measured = _acceptance(service, options, cache)
    acceptance.check_accepts_drafts(measured, required_floor(service), block=draft_block(service))
    return measured


def quick_accept_length(service: ServiceHandle, prompts: Sequence[str], options: LayerOptions, *,
                        max_tokens: int = 64) -> acceptance.Acceptance:
    """Smoke: the accept length on a few greedy prompts reaches the service's floor (`required_floor`).

    A point estimate (greedy accept length is deterministic for a given server); suites/perf bounds it."""
    __tracebackhide__ = True
    _speculative_or_skip(service)
    skips.needs_sglang(service, "accept length needs SGLang's native /generate meta_info")
    measured = measure_acceptance(service, prompts, max_tokens=max_tokens,
                                  allowed=options.allow_state_changes)
    acceptance.check_accepts_drafts(measured, required_floor(service), block=draft_block(service))
    return measured


def ddtree_accepts_at_least_dflash(service: ServiceHandle, options: LayerOptions, cache: Cache,
                                   node: pytest.Item | None) -> None:
    """The DDTREE service's mean accept length >= --ddtree-accept-ratio x every DFLASH service's on the host.

    A DFLASH service that is not usable blocks this test (through the one ready-or-blocked path)."""
    __tracebackhide__ = True
    if options.accept_ratio is None:
        skips.not_applicable("--ddtree-accept-ratio off")
    host = service.host
    linear = [name for name, spec in host.profile.services.items() if spec.algorithm == "DFLASH"]
    if not linear:
        skips.not_applicable(f"no DFLASH service on {host.name} to compare {service.name} with")
    ddtree = _acceptance(service, options, cache)
    for name in linear:
        other = ready_or_blocked(host.service(name), node, role="DFLASH service compared with")
        dflash = _acceptance(other, options, cache)
        ratio = round(ddtree.mean / dflash.mean, 4) if dflash.mean else None
        host.facts.metrics[f"accept_ratio:{service.name}/{name}"] = ratio
        acceptance.check_ddtree_vs_dflash(ddtree, dflash, ratio=options.accept_ratio)


__all__ = ["ACCEPTANCE_SAMPLE", "accept_length", "acceptance_prompts", "ddtree_accepts_at_least_dflash",
           "distribution_parity", "greedy_parity", "measure_acceptance", "quick_accept_length",
           "reference_samples", "require_native", "required_floor"]
