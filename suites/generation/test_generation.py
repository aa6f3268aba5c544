"""Generation layer: the full sampling path of every service, through SGLang's /generate and the OpenAI API.

    pytest --host local suites/generation
    pytest --host ct200 suites/generation -k "generate"

A test during which the service dies fails (the plugin checks the process after every test) and
blocks the service's later tests; the log since the test started and a diagnosis come with it.
"""

from __future__ import annotations

import pytest

from pytest_dflash.api import (
    APIS,
    SAMPLING_CASES,
    STRUCTURED_CASES,
    TOOL_CHOICES,
    Api,
    LayerOptions,
    ServiceHandle,
    bad_parameters,
    concurrent_sampled,
    default_api,
    forced_tool_call,
    greedy,
    long_prompt_near_context,
    max_tokens_boundary,
    n_samples,
    reasoning_separated,
    reasoning_structured,
    sampled_case,
    sampling_varies_with_seed,
    still_serving,
    stop_string,
    stop_token_id,
    streamed,
    structured_output,
    use_api,
)

pytestmark = pytest.mark.generation


@pytest.mark.parametrize("api", APIS)
def test_greedy_generation(dflash_service: ServiceHandle, api: Api) -> None:
    """temperature 0: max_tokens tokens, finish_reason 'length' (ignore_eos)."""
    use_api(dflash_service, api)
    greedy(dflash_service.client, native=dflash_service.native, api=api)


@pytest.mark.parametrize("case", SAMPLING_CASES)
def test_sampled_generation(dflash_service: ServiceHandle, case: str) -> None:
    """Each sampling knob (temperature, top_k, top_p, min_p, seed) on its own, then all together."""
    sampled_case(dflash_service.client, default_api(dflash_service), case)


@pytest.mark.parametrize("api", ("completions", "chat"))
def test_sampled_generation_openai(dflash_service: ServiceHandle, api: Api) -> None:
    """The OpenAI endpoints take the same sampling knobs (top_k, min_p: SGLang extensions)."""
    sampled_case(dflash_service.client, api, "all+seed")


@pytest.mark.parametrize("api", APIS)
def test_streamed_generation(dflash_service: ServiceHandle, api: Api) -> None:
    """Well-formed SSE: monotonic chunks, one finish_reason, final usage (OpenAI), then data: [DONE]."""
    use_api(dflash_service, api)
    streamed(dflash_service.client, native=dflash_service.native, api=api)


@pytest.mark.parametrize("api", APIS)
def test_stop_string(dflash_service: ServiceHandle, api: Api) -> None:
    """A stop string ends the output before it: finish_reason 'stop', the text is the greedy text up to it."""
    use_api(dflash_service, api)
    stop_string(dflash_service.client, api)


@pytest.mark.parametrize("api", ("generate", "completions"))
def test_stop_token_id(dflash_service: ServiceHandle, api: Api) -> None:
    """stop_token_ids ends the output at the token's first occurrence in the greedy output."""
    use_api(dflash_service, "generate")  # the greedy token ids come from /generate
    stop_token_id(dflash_service.client, api)


@pytest.mark.parametrize("api", APIS)
def test_max_tokens_boundary(dflash_service: ServiceHandle, api: Api) -> None:
    """max_tokens 1 and 7 with ignore_eos: exactly that many tokens, finish_reason 'length'."""
    use_api(dflash_service, api)
    max_tokens_boundary(dflash_service.client, api)


@pytest.mark.parametrize("api", APIS)
def test_n_samples(dflash_service: ServiceHandle, api: Api) -> None:
    """n = 3: three complete samples (OpenAI: choices 0..2, usage counts all of them)."""
    use_api(dflash_service, api)
    n_samples(dflash_service.client, api)


@pytest.mark.parametrize("api", ("generate", "completions"))
def test_long_prompt_near_context_limit(dflash_service: ServiceHandle, api: Api,
                                        dflash_layer_options: LayerOptions) -> None:
    """A prompt of ~90% of the served context is answered in full and counted."""
    long_prompt_near_context(dflash_service, api, cap_tokens=dflash_layer_options.long_prompt_tokens)


def test_concurrent_sampled_requests_complete(dflash_service: ServiceHandle,
                                              dflash_layer_options: LayerOptions) -> None:
    """N sampled (top-k/top-p) requests at once, distinct seeds: every one completes in full."""
    api = default_api(dflash_service)
    concurrent_sampled(dflash_service.client, api, count=dflash_layer_options.concurrency)
    still_serving(dflash_service.client, native=dflash_service.native)


@pytest.mark.parametrize("api", APIS)
def test_bad_parameters_get_4xx(dflash_service: ServiceHandle, api: Api) -> None:
    """Invalid sampling values, a prompt over the context, a chat without messages: 4xx, never 5xx or a
    crash."""
    bad_parameters(dflash_service, api)


@pytest.mark.parametrize("api", APIS)
def test_sampling_varies_with_seed(dflash_service: ServiceHandle, api: Api) -> None:
    """Greedy-fallback detection: at temperature 1 different seeds must give different outputs (beyond
    token 1)."""
    use_api(dflash_service, api)
    sampling_varies_with_seed(dflash_service, api)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sse"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("case", STRUCTURED_CASES)
def test_structured_output(dflash_service: ServiceHandle, case: str, sampled: bool, streamed: bool) -> None:
    """json_schema / regex / EBNF (/generate) and response_format (chat): every output is in the grammar's
    language; a server without a grammar backend fails, naming --grammar-backend none and seed 002."""
    api, grammar = STRUCTURED_CASES[case]
    structured_output(dflash_service, api, grammar, sampled=sampled, streamed=streamed)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sse"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("choice", TOOL_CHOICES)
def test_forced_tool_call(dflash_service: ServiceHandle, choice: str, sampled: bool, streamed: bool) -> None:
    """tool_choice required / named where it serves a --tool-call-parser, greedy and sampled, whole or as
    delta.tool_calls: a complete call of a given tool with valid arguments (one cut by max_tokens fails,
    naming the limit)."""
    forced_tool_call(dflash_service, choice, streamed=streamed, sampled=sampled)  # type: ignore[arg-type]


def test_reasoning_separated(dflash_service: ServiceHandle) -> None:
    """Where it serves a --reasoning-parser (/server_info, else its command): reasoning_content and content
    are the whole output split at </think>, nothing lost."""
    reasoning_separated(dflash_service)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sse"])
def test_reasoning_structured(dflash_service: ServiceHandle, streamed: bool) -> None:
    """Where it serves a --reasoning-parser (/server_info, else its command): response_format json_schema
    holds after the reasoning, so content validates against the schema and reasoning_content is free text."""
    reasoning_structured(dflash_service, streamed=streamed)
