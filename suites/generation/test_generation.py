"""Generation layer: the full sampling path of every service, through SGLang's /generate and the OpenAI API.

    pytest --host local suites/generation
    pytest --host ct200 suites/generation -k "generate"

A test during which the service dies fails (the plugin checks the process after every test) and
blocks the service's later tests; the log since the test started and a diagnosis come with it.
"""

from __future__ import annotations

import pytest

from pytest_dflash.layers.generation import checks as generation
from pytest_dflash.layers.generation.checks import APIS, BAD_REQUESTS, SAMPLING_CASES, Api
from pytest_dflash.layers.parity.hooks import LayerOptions
from pytest_dflash.run.state import ServiceHandle

pytestmark = pytest.mark.generation


def _use(service: ServiceHandle, api: Api) -> None:
    reason = generation.require_api(service.native, api)
    if reason:
        pytest.skip(reason)


def _native_or_completions(service: ServiceHandle) -> Api:
    return "generate" if service.native else "completions"


@pytest.mark.parametrize("api", APIS)
def test_greedy_generation(dflash_service: ServiceHandle, api: Api) -> None:
    """temperature 0: max_tokens tokens, finish_reason 'length' (ignore_eos)."""
    _use(dflash_service, api)
    generation.greedy(dflash_service.client, native=dflash_service.native, api=api)


@pytest.mark.parametrize("case", SAMPLING_CASES)
def test_sampled_generation(dflash_service: ServiceHandle, case: str) -> None:
    """Each sampling knob (temperature, top_k, top_p, min_p, seed) on its own, then all together."""
    generation.sampled_case(dflash_service.client, _native_or_completions(dflash_service), case)


@pytest.mark.parametrize("api", ("completions", "chat"))
def test_sampled_generation_openai(dflash_service: ServiceHandle, api: Api) -> None:
    """The OpenAI endpoints take the same sampling knobs (top_k, min_p: SGLang extensions)."""
    generation.sampled_case(dflash_service.client, api, "all+seed")


@pytest.mark.parametrize("api", APIS)
def test_streamed_generation(dflash_service: ServiceHandle, api: Api) -> None:
    """Well-formed SSE: monotonic chunks, one finish_reason, final usage (OpenAI), then data: [DONE]."""
    _use(dflash_service, api)
    generation.streamed(dflash_service.client, native=dflash_service.native, api=api)


@pytest.mark.parametrize("api", APIS)
def test_stop_string(dflash_service: ServiceHandle, api: Api) -> None:
    """A stop string ends the output before it: finish_reason 'stop', the text is the greedy text up to it."""
    _use(dflash_service, api)
    generation.stop_string(dflash_service.client, api)


@pytest.mark.parametrize("api", ("generate", "completions"))
def test_stop_token_id(dflash_service: ServiceHandle, api: Api) -> None:
    """stop_token_ids ends the output at the token's first occurrence in the greedy output."""
    _use(dflash_service, "generate")  # the greedy token ids come from /generate
    generation.stop_token_id(dflash_service.client, api)


@pytest.mark.parametrize("api", APIS)
def test_max_tokens_boundary(dflash_service: ServiceHandle, api: Api) -> None:
    """max_tokens 1 and 7 with ignore_eos: exactly that many tokens, finish_reason 'length'."""
    _use(dflash_service, api)
    generation.max_tokens_boundary(dflash_service.client, api)


@pytest.mark.parametrize("api", APIS)
def test_n_samples(dflash_service: ServiceHandle, api: Api) -> None:
    """n = 3: three complete samples (OpenAI: choices 0..2, usage counts all of them)."""
    _use(dflash_service, api)
    generation.n_samples(dflash_service.client, api)


@pytest.mark.parametrize("api", ("generate", "completions"))
def test_long_prompt_near_context_limit(dflash_service: ServiceHandle, api: Api,
                                        dflash_layer_options: LayerOptions) -> None:
    """A prompt of ~90% of the served context is answered in full and counted."""
    _use(dflash_service, api)
    limit = generation.context_limit(dflash_service.client, dflash_service.server_info)
    if limit is None:
        pytest.skip("the server reports no context length (/v1/models max_model_len, /server_info context_length)")
    generation.long_prompt(dflash_service.client, api, limit, cap_tokens=dflash_layer_options.long_prompt_tokens)


def test_concurrent_sampled_requests_complete(dflash_service: ServiceHandle,
                                              dflash_layer_options: LayerOptions) -> None:
    """N sampled (top-k/top-p) requests at once, distinct seeds: every one completes in full."""
    api = _native_or_completions(dflash_service)
    generation.concurrent_sampled(dflash_service.client, api, count=dflash_layer_options.concurrency)
    generation.still_serving(dflash_service.client, native=dflash_service.native)


@pytest.mark.parametrize("api", APIS)
def test_bad_parameters_get_4xx(dflash_service: ServiceHandle, api: Api) -> None:
    """Invalid sampling values, a prompt over the context, a chat without messages: 4xx, never 5xx or a crash."""
    _use(dflash_service, api)
    limit = generation.context_limit(dflash_service.client, dflash_service.server_info)
    problems = []
    for case, (apis, _) in BAD_REQUESTS.items():
        if api not in apis:
            continue
        try:
            generation.bad_request(dflash_service.client, api, case, context_tokens=limit.tokens if limit else None)
        except AssertionError as exc:
            problems.append(str(exc))
    generation.still_serving(dflash_service.client, native=dflash_service.native)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("api", APIS)
def test_sampling_varies_with_seed(dflash_service: ServiceHandle, api: Api) -> None:
    """Greedy-fallback detection: at temperature 1 different seeds must give different outputs (beyond token 1)."""
    _use(dflash_service, api)
    variation = generation.sample_seeds(dflash_service.client, api)
    generation.check_seed_variation(
        variation, api=api,
        log_line=lambda: generation.service_log_line(dflash_service, generation.GREEDY_FALLBACK_LINE))
