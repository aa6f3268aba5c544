"""Invalid requests (out-of-range sampling parameters, a prompt over the context, chat without messages): the
body of each, and the 4xx with an error message every one must get."""

from __future__ import annotations

from typing import Any

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.layers.generation.requests import APIS, PATHS, PROMPT, Api, messages
from pytest_dflash.layers.generation.shapes import fail

# name -> (flavours it applies to, the offending part of the request). Every one of these is rejected by
# SGLang 0.5.17's own validation (SamplingParams.verify, the context check, the OpenAI schema).
BAD_REQUESTS: dict[str, tuple[tuple[Api, ...], dict[str, Any]]] = {
    "temperature=-1": (APIS, {"temperature": -1}),
    "top_p=1.5": (APIS, {"top_p": 1.5}),
    # SGLang turns temperature 0 into top_k=1 before verifying, so top_k=0 is only invalid when sampling
    # (recorded: 200 at temperature 0 on the H200).
    "top_k=0": (APIS, {"top_k": 0, "temperature": 0.8}),
    "min_p=2": (APIS, {"min_p": 2}),
    "max_tokens=-1": (APIS, {"max_tokens": -1}),
    "prompt over the context": (("generate", "completions"), {"prompt_chars": 0}),
    "chat without messages": (("chat",), {"messages": None}),
}


def bad_request_body(client: InferenceClient, api: Api, case: str, *,
                     context_tokens: int | None) -> dict[str, Any]:
    """The request body of BAD_REQUESTS[case] in flavour `api`."""
    _, change = BAD_REQUESTS[case]
    params: dict[str, Any] = {"temperature": 0.0, "max_tokens": 4}
    prompt = PROMPT
    drop_messages = False
    for key, value in change.items():
        if key == "prompt_chars":
            # digits: one token each on Qwen, at most three per token on other BPE vocabularies
            digits = (context_tokens or 32768) * 3 + 16
            prompt = ("0123456789" * (digits // 10 + 1))[:digits]
        elif key == "messages":
            drop_messages = True
        else:
            params[key] = value
    if api == "generate":
        sampling = {("max_new_tokens" if k == "max_tokens" else k): v for k, v in params.items()}
        return {"text": prompt, "sampling_params": sampling}
    body: dict[str, Any] = {"model": client.model(), **params}
    if api == "completions":
        body["prompt"] = prompt
    elif not drop_messages:
        body["messages"] = messages(prompt)
    return body


def bad_request(client: InferenceClient, api: Api, case: str, *, context_tokens: int | None,
                timeout_s: float = 30.0) -> int:
    """An invalid request must get a 4xx with an error message: never a 5xx, never a dropped connection."""
    __tracebackhide__ = True
    body = bad_request_body(client, api, case, context_tokens=context_tokens)
    path = PATHS[api]
    response = client.request("POST", path, json_body=body, timeout_s=timeout_s)  # no answer: ApiError
    shown = {k: (v if not isinstance(v, str) or len(v) < 60 else f"<{len(v)} characters>")
             for k, v in body.items()}
    if not 400 <= response.status_code < 500:
        fail(f"bad request [{case}] to {path} answered HTTP {response.status_code}, expected 4xx: "
              f"{response.text[:300]!r} (request {shown})")
    if not response.text.strip():
        fail(f"bad request [{case}] to {path}: HTTP {response.status_code} with an empty body (no "
             "error message)")
    return response.status_code


__all__ = ["BAD_REQUESTS", "bad_request", "bad_request_body"]
