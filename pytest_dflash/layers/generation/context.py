"""The served context length, and a prompt that fills most of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_dflash.client.bodies import answer_json
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Generation, Sampling
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.generation.requests import PATHS, Api, request
from pytest_dflash.layers.generation.shapes import check_full_length, fail


@dataclass(frozen=True)
class ContextLimit:
    tokens: int
    source: str


def context_limit(client: InferenceClient, server_info: Mapping[str, Any] | None) -> ContextLimit | None:
    """The served context length: /v1/models max_model_len, else /server_info context_length."""
    try:
        response = client.request("GET", "/v1/models", timeout_s=10)
        data = (answer_json(response, client.service, "/v1/models").get("data")
                if response.status_code == 200 else None)
    except (ApiError, ValueError, AttributeError):
        data = None
    for card in data or []:
        if isinstance(card, dict) and isinstance(card.get("max_model_len"), int):
            return ContextLimit(int(card["max_model_len"]), "/v1/models max_model_len")
    value = (server_info or {}).get("context_length")
    if isinstance(value, int) and value > 0:
        return ContextLimit(value, "/server_info context_length")
    return None


FILLER = "The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. "


def long_prompt(client: InferenceClient, api: Api, limit: ContextLimit, *, max_tokens: int = 8,
                fill: float = 0.9, cap_tokens: int | None = None,
                timeout_s: float | None = None) -> Generation:
    """A prompt of about `fill` x (context - max_tokens) tokens is answered in full ('length', prompt
    counted)."""
    __tracebackhide__ = True
    probe_sampling = Sampling(max_tokens=1, temperature=0.0, ignore_eos=True)
    probe_text = FILLER * 8
    flavour: Api = "completions" if api == "chat" else api  # a chat template would add tokens of its own
    probe = request(client, flavour, probe_text, probe_sampling)[0]
    if not probe.prompt_tokens:
        fail(f"long prompt ({PATHS[flavour]}): the server reports no prompt_tokens for a "
              f"{len(probe_text)}-character prompt")
    assert probe.prompt_tokens is not None
    chars_per_token = len(probe_text) / probe.prompt_tokens
    target = int((limit.tokens - max_tokens) * fill)
    if cap_tokens is not None:
        target = min(target, cap_tokens)
    text = (FILLER * (int(target * chars_per_token / len(FILLER)) + 2))[: int(target * chars_per_token)]
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    gen = request(client, flavour, text, sampling, timeout_s=timeout_s)[0]
    where = (f"long prompt of {len(text)} characters (~{target} tokens, context {limit.tokens} from "
             f"{limit.source}) ({PATHS[flavour]})")
    check_full_length([gen], sampling, what=where)
    if gen.prompt_tokens is None or not 0.8 * target <= gen.prompt_tokens <= limit.tokens - max_tokens:
        fail(f"{where}: prompt_tokens = {gen.prompt_tokens}, expected about {target}")
    return gen


__all__ = ["FILLER", "ContextLimit", "context_limit", "long_prompt"]
