"""Request parameters: SGLang 0.5.17's SamplingParams normalisation and verify(), with its error messages.

Shared by the native routes (routes.py) and the OpenAI ones (openai_api.py); a BadRequest becomes a
400 in the error body of the route that raised it.
"""

from __future__ import annotations

import dataclasses
import math

from pytest_dflash.refserver.spec import SAMPLING_EPS, SamplingParams
from pytest_dflash.refserver.structured import NO_BACKEND, GrammarBackend, InvalidGrammar, grammar_key

__all__ = ["SAMPLING_KEYS", "BadRequest", "check_grammar", "parse_sampling_params"]

SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "sampling_seed", "n", "no_stop_trim", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "spaces_between_special_tokens", "stop_regex", "custom_params",
    "json_schema", "regex", "ebnf", "structural_tag", "logit_bias",
}  # fmt: skip


# DFLASH and DDTREE refuse return_logprob with the same text: the ddtree-v2 port inherits the DFlash check
# (recorded on the H200: tests/data/sglang-0.5.17-h200-ddtree/run3-fi-warm/probe_ddtree_flashinfer.json).
LOGPROB_REFUSED = "DFLASH speculative decoding does not support return_logprob yet."


class BadRequest(Exception):
    """A request SGLang would answer with HTTP 400; the message is SGLang's."""


def parse_sampling_params(raw: object, *, context_length: int, prompt_len: int) -> SamplingParams:
    """SGLang's SamplingParams: normalise, then verify(), with its error messages."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest("sampling_params must be an object.")
    for key in raw:
        if key not in SAMPLING_KEYS:
            raise BadRequest(f"SamplingParams.__init__() got an unexpected keyword argument '{key}'")
    try:
        grammar = grammar_key(raw)
    except InvalidGrammar as e:
        raise BadRequest(str(e)) from None
    temperature = raw.get("temperature", 1.0)
    top_p, top_k, min_p = raw.get("top_p", 1.0), raw.get("top_k", -1), raw.get("min_p", 0.0)
    max_new = raw.get("max_new_tokens", 128)
    n = raw.get("n", 1)
    number = (int, float)
    if not isinstance(temperature, number) or not math.isfinite(temperature) or temperature < 0:
        raise BadRequest(f"temperature must be a non-negative finite number, got {temperature}.")
    if not isinstance(top_p, number) or not 0.0 < top_p <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}.")
    if not isinstance(min_p, number) or not 0.0 <= min_p <= 1.0:
        raise BadRequest(f"min_p must be in [0, 1], got {min_p}.")
    if isinstance(temperature, number) and 0 <= temperature < SAMPLING_EPS:
        # SGLang rewrites greedy to top_k=1 before verifying, so top_k=0 at temperature 0 is accepted
        top_k = 1
    if not isinstance(top_k, int) or (top_k < 1 and top_k != -1):
        raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
        raise BadRequest(f"max_new_tokens must be at least 0, got {max_new}.")
    if not isinstance(n, int) or n < 1:
        raise BadRequest(f"n must be at least 1, got {n}.")
    if prompt_len >= context_length:
        raise BadRequest(
            f"The input ({prompt_len} tokens) is longer than the model's context length ({context_length} "
            f"tokens)."
        )
    asked = raw.get("max_new_tokens")  # SGLang checks the total only when max_new_tokens was given
    if asked is not None and asked + prompt_len >= context_length:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {asked + prompt_len} tokens: {prompt_len} tokens from the input "
            f"messages and {asked} tokens for the completion. Please reduce the number of tokens in the "
            "input messages or the completion to fit within the limit."
        )
    if max_new is None:  # OpenAI chat without max_tokens: up to the context length
        max_new = context_length - prompt_len
    stop = raw.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    stop_ids = raw.get("stop_token_ids") or []
    if not all(isinstance(s, str) for s in stop) or not all(isinstance(t, int) for t in stop_ids):
        raise BadRequest("stop must be a string or a list of strings; stop_token_ids a list of integers.")
    seed = raw.get("sampling_seed")
    if seed is not None and not isinstance(seed, int):
        raise BadRequest(f"sampling_seed must be an integer, got {seed}.")
    temperature = float(temperature)
    if temperature < SAMPLING_EPS:
        temperature, top_k = 1.0, 1  # SGLang: temperature 0 means greedy
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=temperature,
        top_p=float(top_p),
        top_k=top_k,
        min_p=float(min_p),
        stop=list(stop),
        stop_token_ids=list(stop_ids),
        ignore_eos=bool(raw.get("ignore_eos", False)),
        skip_special_tokens=bool(raw.get("skip_special_tokens", True)),
        sampling_seed=seed,
        n=n,
        grammar=grammar,
    )


def check_grammar(params: SamplingParams, backend: GrammarBackend | None, *,
                  stream: bool = False) -> SamplingParams:
    """A constrained request's grammar compiles on this server, else SGLang's 400. Without a backend
    (--grammar-backend none): a 400, but a streamed request is accepted and aborted after its first token
    (recorded from SGLang 0.5.17: tests/data/sglang-0.5.17-h100-structured); the params to run."""
    if params.grammar is None:
        return params
    if backend is None:
        if not stream:
            raise BadRequest(NO_BACKEND)
        return dataclasses.replace(params, grammar=None, max_new_tokens=1, abort_after_first=NO_BACKEND)
    try:
        backend.compile(params.grammar)
    except InvalidGrammar as e:
        raise BadRequest(str(e)) from None
    return params
