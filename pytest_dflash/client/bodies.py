"""Response bodies: the byte cap of each answer (`response_cap`: what a generation request allows, else
`DEFAULT_MAX_BODY`, `/metrics` `METRICS_MAX_BODY`), the one decoding of an answer's JSON (`answer_json`: not
JSON, or nested too deep, is an ApiError naming the endpoint) and an error body's message. What a generation
answer says is read in client/answers.py, nowhere else."""

from __future__ import annotations

import json
from typing import Any

import httpx

from pytest_dflash.documents import loads_json
from pytest_dflash.errors import ApiError
from pytest_dflash.scrub.terminal import terminal_safe

# Caps on response bodies (bytes). Non-generation endpoints (/v1/models, /server_info, /model_info,
# /flush_cache, error bodies) answer a few KB on SGLang 0.5.17; /metrics is Prometheus text with a
# histogram per metric and label set, hundreds of KB on a busy server, so it gets far more room.
DEFAULT_MAX_BODY = 256 * 1024
METRICS_MAX_BODY = 32 * 1024 * 1024
STREAM_MAX_TOTAL = 256 * 1024 * 1024  # a native /generate stream repeats its cumulative text per event
GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
_BASE_BODY = 64 * 1024  # meta_info, usage, spec histograms, headers of the JSON
# Per generated token: text (up to 4 characters, JSON-escaped as \uXXXX), id, a [logprob, id, text]
# entry and SGLang's per-token meta — several times what SGLang 0.5.17 was recorded sending.
_PER_TOKEN = 512
_PER_TOP_LOGPROB = 128
_TOKENS_UNBOUNDED = 32768  # no max_tokens: SGLang generates up to the context length


NEWLINES = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines splits on


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _prompts(path: str, body: dict[str, Any]) -> list[Any]:
    """The prompts of a generation request (SGLang and OpenAI both accept a batch as a list)."""
    if path == "/v1/chat/completions":
        return [body.get("messages")]
    key = "prompt" if path == "/v1/completions" else ("text" if "text" in body else "input_ids")
    value = body.get(key)
    if isinstance(value, list) and value and (key != "input_ids" or isinstance(value[0], list)) and not (
            key == "prompt" and isinstance(value[0], int)):
        return value
    return [value]


def requested_tokens(path: str, body: Any) -> int:
    """Tokens a generation request allows in all: max tokens × n × prompts (unbounded: the context)."""
    if path not in GENERATION_PATHS or not isinstance(body, dict):
        return 0
    prompts = len(_prompts(path, body))
    if path == "/generate":
        params = body.get("sampling_params") or {}
        per_prompt = params if isinstance(params, list) else [params] * prompts
        return sum((_count(p.get("max_new_tokens")) or _TOKENS_UNBOUNDED) * max(1, _count(p.get("n")))
                   for p in per_prompt if isinstance(p, dict)) or _TOKENS_UNBOUNDED
    tokens = _count(body.get("max_tokens")) or _count(body.get("max_completion_tokens")) or _TOKENS_UNBOUNDED
    return tokens * max(1, _count(body.get("n"))) * prompts


def response_cap(path: str, body: Any = None) -> int:
    """The most bytes a response to `body` at `path` may have before it is refused unread.

    Generations: room for everything the request allows (max tokens × n × prompts, each token with
    its text, id and logprob entries, top logprobs when asked, the prompt echoed back) plus a fixed
    64 KB; `/metrics`: METRICS_MAX_BODY; everything else: DEFAULT_MAX_BODY.
    """
    if path.startswith("/metrics"):
        return METRICS_MAX_BODY
    tokens = requested_tokens(path, body)
    if not tokens or not isinstance(body, dict):
        return DEFAULT_MAX_BODY
    top = max(_count(body.get("top_logprobs_num")), _count(body.get("top_logprobs")),
              _count(body.get("logprobs")))
    per_token = _PER_TOKEN + top * _PER_TOP_LOGPROB
    request_size = len(json.dumps(body, default=str))
    # return_logprob / echo can add an entry per prompt token; a prompt has at most one token per byte.
    prompt_entries = request_size if body.get("return_logprob") or body.get("echo") else 0
    return _BASE_BODY + 2 * request_size + (tokens + prompt_entries) * per_token


def answer_json(response: httpx.Response, service: str, path: str) -> Any:
    """A server's answer parsed as JSON: the one place an answer is decoded. One that is not JSON (not UTF-8,
    malformed, nested too deep: documents.py) is an ApiError naming the endpoint and quoting the body's start,
    never a bare JSONDecodeError or RecursionError."""
    try:
        return loads_json(response.content)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, DocumentTooDeep
        raise ApiError(service, path, response.status_code, f"malformed JSON body: {exc}",
                       response.content[:300].decode("utf-8", "replace")) from None


def error_message(response: httpx.Response) -> str:
    """The human message of an SGLang/OpenAI error body ({"error":{"message"}}, {"message"}, {"detail"}), safe
    to print: the server wrote it, so its control characters are written out and none of its lines is a CI
    workflow command (scrub/terminal.py)."""
    return terminal_safe(_error_text(response))


def _error_text(response: httpx.Response) -> str:
    try:
        body = loads_json(response.content)
    except ValueError:  # not JSON, or nested too deep: the body as it came
        return response.content[:300].decode("utf-8", "replace") or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:500]
        if isinstance(error, str):
            return error[:500]
        for key in ("message", "detail"):
            if key in body:
                return str(body[key])[:500]
    return json.dumps(body)[:300]


def json_kind(data: Any) -> str:
    """What a JSON value is, in words, for a message about a body that should have been an object."""
    if isinstance(data, list):
        return "a JSON list" if data else "an empty JSON list"
    if data is None:
        return "JSON null"
    if isinstance(data, bool):
        return "a JSON boolean"
    if isinstance(data, int | float):
        return "a JSON number"
    if isinstance(data, str):
        return "a JSON string"
    return "a JSON object" if isinstance(data, dict) else type(data).__name__
