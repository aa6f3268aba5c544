"""The API flavours a generation check speaks, and one request sent in one of them.

SGLang's native ``/generate`` ("generate", token ids visible) or the OpenAI endpoints ("completions", "chat").
A server that is not SGLang has no native flavour.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pytest_dflash.client.answers import whole_answers
from pytest_dflash.client.bodies import answer_json
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Generation, Sampling, Stream
from pytest_dflash.errors import ApiError

Api = Literal["generate", "completions", "chat"]

APIS: tuple[Api, ...] = ("generate", "completions", "chat")

PATHS: dict[Api, str] = {"generate": "/generate", "completions": "/v1/completions",
                         "chat": "/v1/chat/completions"}

PROMPT = "The quick brown fox"


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def request(client: InferenceClient, api: Api, prompt: str, sampling: Sampling, *,
            timeout_s: float | None = None) -> list[Generation]:
    """One request in one flavour; one Generation per sample (n > 1 gives several)."""
    if api == "generate":
        if sampling.n > 1:
            return client.generate_many(prompt, sampling, timeout_s=timeout_s)
        return [client.generate(prompt, sampling, timeout_s=timeout_s)]
    if api == "completions":
        return client.completion(prompt, sampling, timeout_s=timeout_s)
    return client.chat(messages(prompt), sampling, timeout_s=timeout_s)


def request_stream(client: InferenceClient, api: Api, prompt: str, sampling: Sampling, *,
                   timeout_s: float | None = None) -> Stream:
    if api == "generate":
        return client.generate_stream(prompt, sampling, timeout_s=timeout_s)
    if api == "completions":
        return client.completion_stream(prompt, sampling, timeout_s=timeout_s)
    return client.chat_stream(messages(prompt), sampling, timeout_s=timeout_s)


def request_default(client: InferenceClient, prompt: str, sampling: Sampling, *, native: bool,
              timeout_s: float | None = None) -> Generation:
    return request(client, "generate" if native else "completions", prompt, sampling, timeout_s=timeout_s)[0]


def generate_batch(client: InferenceClient, prompts: Sequence[str], samplings: Sequence[Sampling], *,
                   timeout_s: float | None = None) -> list[Generation]:
    """One native /generate request carrying a batch: prompt i with sampling i (SGLang's list form)."""
    if len(prompts) != len(samplings):
        raise ValueError("one sampling per prompt")
    body = {"text": list(prompts), "sampling_params": [s.as_sglang() for s in samplings]}
    response = client.request("POST", "/generate", json_body=body, timeout_s=timeout_s)
    if response.status_code >= 400:
        raise ApiError(client.service, "/generate", response.status_code, "batch request refused",
                       response.text[:500])
    data = answer_json(response, client.service, "/generate")
    if not isinstance(data, list) or len(data) != len(prompts):
        raise ApiError(client.service, "/generate", response.status_code,
                       f"a batch of {len(prompts)} got "
                       f"{len(data) if isinstance(data, list) else 'no'} results",
                       response.text[:300])
    out = []
    for answer in whole_answers(data, "generate", client.service):
        if answer.output_ids is None:
            raise ApiError(client.service, "/generate", response.status_code,
                           "a batch result lacks output_ids", response.text[:300])
        out.append(Generation(answer))
    return out


__all__ = [
    "APIS",
    "PATHS",
    "PROMPT",
    "Api",
    "generate_batch",
    "messages",
    "request",
    "request_default",
    "request_stream",
]
