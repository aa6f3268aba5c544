"""Generation-layer checks: what the suites call. Each sends real requests and raises AssertionError with the
evidence.

One function per line of the suite's checklist, each short; the requests, the shape of an answer, invalid
requests, the context limit and greedy-fallback detection they build on are modules of their own beside this
one (requests.py, shapes.py, bad_requests.py, context.py, seeds.py). Every check speaks one API flavour:
SGLang's native ``/generate`` or the OpenAI endpoints (requests.py).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import SAMPLED, Generation, Sampling
from pytest_dflash.config.profiles import AUTO
from pytest_dflash.errors import ApiError, DflashError
from pytest_dflash.layers.generation.bad_requests import BAD_REQUESTS, bad_request
from pytest_dflash.layers.generation.context import context_limit, long_prompt
from pytest_dflash.layers.generation.requests import (
    PATHS,
    PROMPT,
    Api,
    request,
    request_default,
    request_stream,
)
from pytest_dflash.layers.generation.seeds import (
    GREEDY_FALLBACK_LINE,
    SeedVariation,
    check_seed_variation,
    sample_seeds,
    service_log_line,
)
from pytest_dflash.layers.generation.shapes import (
    StreamCheck,
    check_completion_shape,
    check_full_length,
    check_stream,
    fail,
)
from pytest_dflash.run import skips

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

# Sampling configurations of the sampled-generation test: each knob alone, then all together.
SAMPLING_CASES: dict[str, Sampling] = {
    "temperature": Sampling(max_tokens=16, temperature=0.7, ignore_eos=True),
    "top_k": Sampling(max_tokens=16, temperature=0.8, top_k=20, ignore_eos=True),
    "top_p": Sampling(max_tokens=16, temperature=0.8, top_p=0.9, ignore_eos=True),
    "min_p": Sampling(max_tokens=16, temperature=0.8, min_p=0.05, ignore_eos=True),
    "all+seed": Sampling(max_tokens=16, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=7,
                         ignore_eos=True),
}


def require_api(native: bool, api: Api) -> str | None:
    """Why `api` cannot be used on this server, or None."""
    if api == "generate" and not native:
        return "SGLang's native /generate is not served here (not an SGLang server)"
    return None


def use_api(service: ServiceHandle, api: Api) -> None:
    """Skip the test when `service` cannot speak `api`: /generate needs SGLang (run/skips.py `needs_sglang`:
    'could not check' for a service that should speak it, else 'does not apply')."""
    if api == "generate":
        skips.needs_sglang(service, "SGLang's native /generate is not served here")


def default_api(service: ServiceHandle) -> Api:
    """SGLang's native /generate where served, else the OpenAI completions endpoint."""
    return "generate" if service.native else "completions"


def greedy(client: InferenceClient, *, native: bool, max_tokens: int = 16,
           api: Api | None = None) -> Generation:
    """One greedy generation, checked; returns it."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    flavour: Api = api or ("generate" if native else "completions")
    gen = request(client, flavour, PROMPT, sampling)[0]
    check_completion_shape(gen, sampling, what=f"greedy generation ({PATHS[flavour]})")
    if gen.finish_reason != "length":
        fail(f"greedy generation ({PATHS[flavour]}): finish_reason {gen.finish_reason!r} with ignore_eos, "
              "expected 'length'")
    return gen


def sampled(client: InferenceClient, *, native: bool, seed: int | None = None, max_tokens: int = 16,
            timeout_s: float | None = None) -> Generation:
    """One sampled generation through the top-k/top-p kernel (the request that killed seed 004's server)."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=SAMPLED.temperature, top_k=SAMPLED.top_k,
                        top_p=SAMPLED.top_p, seed=seed, ignore_eos=True)
    gen = request_default(client, PROMPT, sampling, native=native, timeout_s=timeout_s)
    check_completion_shape(gen, sampling, what="sampled generation (temperature 0.8, top_k 20, top_p 0.9)")
    return gen


def sampled_case(client: InferenceClient, api: Api, case: str) -> list[Generation]:
    """A sampled request with one of SAMPLING_CASES, checked to run to max_tokens."""
    __tracebackhide__ = True
    sampling = SAMPLING_CASES[case]
    gens = request(client, api, PROMPT, sampling)
    check_full_length(gens, sampling, what=f"sampled generation [{case}: {describe_sampling(sampling)}] "
                                           f"({PATHS[api]})")
    return gens


def describe_sampling(sampling: Sampling) -> str:
    parts = [f"temperature {sampling.temperature:g}"]
    for name in ("top_k", "top_p", "min_p", "seed"):
        value = getattr(sampling, name)
        if value is not None:
            parts.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    if sampling.n != 1:
        parts.append(f"n {sampling.n}")
    return ", ".join(parts)


def n_samples(client: InferenceClient, api: Api, *, n: int = 3, max_tokens: int = 12) -> list[Generation]:
    """n > 1 at temperature 1: n complete samples (and, natively, n distinct requests)."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=1.0, n=n, seed=11, ignore_eos=True)
    gens = request(client, api, PROMPT, sampling)
    check_full_length(gens, sampling, what=f"n={n} generation ({PATHS[api]})")
    return gens


def max_tokens_boundary(client: InferenceClient, api: Api, *, limits: Sequence[int] = (1, 7)) -> None:
    """max_tokens N with ignore_eos: exactly N tokens and finish_reason 'length', for N = 1 and a few more."""
    __tracebackhide__ = True
    for limit in limits:
        sampling = Sampling(max_tokens=limit, temperature=0.0, ignore_eos=True)
        gens = request(client, api, PROMPT, sampling)
        check_full_length(gens, sampling, what=f"max_tokens={limit} ({PATHS[api]})")


def streamed(client: InferenceClient, *, native: bool, max_tokens: int = 16,
             api: Api | None = None) -> StreamCheck:
    """A greedy streamed generation, checked: well-formed SSE to [DONE], max_tokens tokens ('length')."""
    __tracebackhide__ = True
    flavour: Api = api or ("generate" if native else "completions")
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    stream = request_stream(client, flavour, PROMPT, sampling)
    what = f"streamed generation ({PATHS[flavour]})"
    check = check_stream(stream, native=flavour == "generate", max_tokens=max_tokens, what=what,
                         chat=flavour == "chat")
    if check.tokens != max_tokens:
        fail(f"{what}: {check.tokens} tokens streamed with ignore_eos, expected max_tokens={max_tokens}")
    return check


def stop_string(client: InferenceClient, api: Api, *, max_tokens: int = 24) -> Generation:
    """A stop string taken from the greedy output ends generation there: finish 'stop', string not in
    the text. The whole output is compared, reasoning first (a chat under a reasoning parser splits it into
    reasoning_content and content; a stop string applies to both), and the stop string is taken from one part
    (the server matches it in the text between them, `</think>` included)."""
    __tracebackhide__ = True
    free = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    greedy_answer = request(client, api, PROMPT, free)[0]
    full = greedy_answer.output
    stop = pick_stop_string(full, boundary=len(greedy_answer.reasoning or ""))
    if stop is None:
        fail(f"stop string ({PATHS[api]}): the greedy output {full!r} has no 2-character substring that "
              "could serve as a stop string")
    stopped = request(client, api, PROMPT, replace(free, stop=(stop,)))[0]
    where = f"stop string {stop!r} ({PATHS[api]})"
    if stopped.finish_reason != "stop":
        fail(f"{where}: finish_reason {stopped.finish_reason!r}, expected 'stop' (greedy text {full!r}, "
              f"stopped text {stopped.text!r})")
    if stop in stopped.output:
        fail(f"{where}: the stop string is in the returned text {stopped.output!r}")
    expected = full[: full.index(stop)]
    if stopped.output != expected:
        fail(f"{where}: text {stopped.output!r}, expected the greedy text up to the stop string: "
             f"{expected!r}")
    if stopped.matched_stop is not None and stopped.matched_stop != stop:
        fail(f"{where}: matched_stop {stopped.matched_stop!r}")
    return stopped


def pick_stop_string(text: str, *, boundary: int = 0) -> str | None:
    """A short substring of `text` whose first occurrence is well inside it (printable, no
    replacement char), not across `boundary` (where reasoning ends and content begins)."""
    for start in range(4, max(4, len(text) - 2)):
        candidate = text[start : start + 2]
        if start < boundary < start + 2:
            continue
        if (len(candidate) == 2 and candidate.isprintable() and "\ufffd" not in candidate
                and candidate.strip() and text.index(candidate) == start):
            return candidate
    return None


def stop_token_id(client: InferenceClient, api: Api, *, max_tokens: int = 24) -> Generation:
    """stop_token_ids: generation ends at the first occurrence of the token (finish 'stop', matched =
    the id)."""
    __tracebackhide__ = True
    # No ignore_eos: SGLang checks stop_token_ids in the same branch as EOS, so ignore_eos disables them
    # (seen on the H200: with ignore_eos the stop id was generated and not honoured).
    free = Sampling(max_tokens=max_tokens, temperature=0.0)
    ids = client.generate(PROMPT, free).output_ids or []
    position = next((i for i in range(2, len(ids)) if ids[i] not in ids[:i]), None)
    if position is None:
        fail(f"stop token id: the greedy output ids {ids} have no token that first appears after position 1")
    token = ids[position]
    stopped = request(client, api, PROMPT, replace(free, stop_token_ids=(token,)))[0]
    where = f"stop_token_ids=[{token}] ({PATHS[api]})"
    if stopped.finish_reason != "stop":
        fail(f"{where}: finish_reason {stopped.finish_reason!r} after {stopped.completion_tokens} tokens, "
              f"expected 'stop' at token {position} of the greedy ids {ids}")
    if stopped.matched_stop is not None and stopped.matched_stop != token:
        fail(f"{where}: matched_stop {stopped.matched_stop!r}, expected {token}")
    if stopped.output_ids is not None and stopped.output_ids not in (ids[:position], ids[: position + 1]):
        fail(f"{where}: output_ids {stopped.output_ids}, expected the greedy ids up to the stop token: "
              f"{ids[: position + 1]}")
    if stopped.completion_tokens not in (position, position + 1):
        fail(f"{where}: {stopped.completion_tokens} tokens, expected {position + 1} (the stop token "
             f"at {position})")
    return stopped


def concurrent_sampled(client: InferenceClient, api: Api, *, count: int = 16, max_tokens: int = 16,
                       timeout_s: float | None = None) -> list[Generation]:
    """`count` sampled (top-k/top-p) requests with distinct seeds at once: every one completes, in full."""
    __tracebackhide__ = True
    base = Sampling(max_tokens=max_tokens, temperature=0.8, top_k=20, top_p=0.9, ignore_eos=True)

    def one(index: int) -> Generation:
        return request(client, api, f"{PROMPT} {index}", replace(base, seed=1000 + index),
                       timeout_s=timeout_s)[0]

    results: dict[int, Generation] = {}
    errors: dict[int, DflashError] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=count,
                                               thread_name_prefix="dflash-concurrent") as pool:
        futures = {pool.submit(one, index): index for index in range(count)}
        for future in concurrent.futures.as_completed(futures):
            index = futures[future]
            try:
                results[index] = future.result()
            except DflashError as exc:
                errors[index] = exc
    if errors:
        first = min(errors)
        fail(f"{len(errors)} of {count} concurrent sampled requests ({PATHS[api]}) failed; request {first}: "
              f"{errors[first]}")
    for index in range(count):
        check_full_length([results[index]], base, what=f"concurrent sampled request {index} of {count} "
                                                       f"({PATHS[api]})")
    return [results[index] for index in range(count)]


def bad_parameters(service: ServiceHandle, api: Api) -> None:
    """Every BAD_REQUESTS case of `api` gets a 4xx (all of them tried, every problem reported), then the
    server still serves a greedy request."""
    __tracebackhide__ = True
    use_api(service, api)
    limit = context_limit(service.client, service.server_info)
    problems = []
    for case, (apis, _) in BAD_REQUESTS.items():
        if api not in apis:
            continue
        try:
            bad_request(service.client, api, case, context_tokens=limit.tokens if limit else None)
        except AssertionError as exc:
            problems.append(str(exc))
    still_serving(service.client, native=service.native)
    if problems:
        fail("\n".join(problems))


def long_prompt_near_context(service: ServiceHandle, api: Api, *, cap_tokens: int | None) -> None:
    """long_prompt at ~90% of the context the server reports; skipped when it reports none."""
    __tracebackhide__ = True
    use_api(service, api)
    limit = context_limit(service.client, service.server_info)
    if limit is None:
        reason = ("the server reports no context length (/v1/models max_model_len, /server_info "
                  "context_length)")
        if service.native:
            skips.could_not_check(f"{service.label}: {reason}")
        skips.not_applicable(reason)
    long_prompt(service.client, api, limit, cap_tokens=cap_tokens)


def still_serving(client: InferenceClient, *, native: bool, timeout_s: float = 30.0) -> None:
    """After an abusive test: the server still answers a small greedy request (dead or wedged fails here)."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=4, temperature=0.0, ignore_eos=True)
    try:
        gen = request_default(client, PROMPT, sampling, native=native, timeout_s=timeout_s)
    except ApiError as exc:
        fail(f"the server stopped serving after this test: a 4-token greedy request failed: {exc}")
    check_completion_shape(gen, sampling, what="greedy request after the test")


def served_algorithm_unknown(service: ServiceHandle) -> str | None:
    """Why the served algorithm cannot be compared with the profile's (skip reason), or None."""
    if service.spec.discovery_error is not None:
        return None  # check_served_algorithm fails with it
    if not service.native:
        return "needs SGLang's /server_info (not an SGLang server)"
    if service.spec.algorithm == AUTO:
        return ("the attached server's algorithm was not read before the tests were selected (no profile "
                "algorithm)")
    return None


def check_served_algorithm(service: ServiceHandle) -> None:
    """The server runs the profile's speculative algorithm (/server_info speculative_algorithm; none = NONE).

    A DFLASH unit that serves plain decoding passes every generation check and is only slower: this is the one
    check that sees it.
    """
    __tracebackhide__ = True
    if service.spec.discovery_error is not None:
        fail(f"{service.label}: {service.spec.discovery_error}")
    served = str((service.server_info or {}).get("speculative_algorithm") or "NONE").upper()
    if served != service.spec.algorithm:
        fail(f"{service.label}: the profile says {service.spec.algorithm}, the server runs {served} "
              "(server_info speculative_algorithm); check the unit's --speculative-algorithm")


def sampling_varies_with_seed(service: ServiceHandle, api: Api | None = None) -> SeedVariation:
    """Greedy-fallback detection on `service`: SEED_PROMPT sampled with different seeds must vary beyond
    token 1.

    One batched native request of 32 samples (else 16 concurrent completions): cheap enough for the smoke
    suite. On a failure, SGLang's greedy-fallback warning is quoted from the service log when it is there.
    """
    __tracebackhide__ = True
    flavour: Api = api or ("generate" if service.native else "completions")
    variation = sample_seeds(service.client, flavour)
    check_seed_variation(variation, api=flavour,
                         log_line=lambda: service_log_line(service, GREEDY_FALLBACK_LINE))
    return variation


__all__ = [
    "SAMPLING_CASES",
    "bad_parameters",
    "check_served_algorithm",
    "concurrent_sampled",
    "default_api",
    "describe_sampling",
    "greedy",
    "long_prompt_near_context",
    "max_tokens_boundary",
    "n_samples",
    "pick_stop_string",
    "require_api",
    "sampled",
    "sampled_case",
    "sampling_varies_with_seed",
    "served_algorithm_unknown",
    "still_serving",
    "stop_string",
    "stop_token_id",
    "streamed",
    "use_api",
]
