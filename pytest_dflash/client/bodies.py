"""Response bodies: the byte cap of each answer (`response_cap`: what a generation request allows, else
`DEFAULT_MAX_BODY`, `/metrics` `METRICS_MAX_BODY`), the one decoding of an answer's JSON (`answer_json`: not
JSON, or nested too deep, is an ApiError naming the endpoint), and the parsing of answers into `Generation`s,
error messages and streamed token counts."""

from __future__ import annotations

import json
from typing import Any

import httpx

from pytest_dflash.client.sampling import Generation
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




def stream_tokens(events: list[dict[str, Any]], before: int) -> int:
    """Tokens streamed so far: native /generate events carry the cumulative output_ids (or completion_tokens);
    OpenAI chunks carry one delta each (a chunk with text, content or a tool-call delta counts one token, at
    least)."""
    last = events[-1]
    if isinstance(last.get("output_ids"), list):
        return len(last["output_ids"])
    meta = last.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("completion_tokens"), int):
        return int(meta["completion_tokens"])
    usage = last.get("usage")
    if (isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int)
            and not last.get("choices")):
        return max(before, int(usage["completion_tokens"]))
    for choice in last.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("tool_calls"):
            return before + 1
    return before


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


def _finish(reason: Any) -> tuple[str | None, int | str | None]:
    if isinstance(reason, dict):
        return reason.get("type"), reason.get("matched")
    return (str(reason) if reason is not None else None), None


def _pairs(raw: Any) -> list[tuple[float, int]]:
    # SGLang: [logprob, token_id, token_text|null]
    return [(float(item[0]), int(item[1])) for item in raw or [] if isinstance(item, list) and len(item) >= 2]


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


def chat_choice(data: Any, service: str, path: str) -> dict[str, Any]:
    """Choice 0 of an OpenAI answer, with its `message` (chat) an object; an answer that has none (a 200 that
    carries an error object, no choices, a list) is an ApiError quoting it, never an AttributeError."""
    if not isinstance(data, dict):
        raise ApiError(service, path, 200, f"response is {json_kind(data)}, not an object",
                       json.dumps(data)[:300])
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        raise ApiError(service, path, 200, "response has no choices", json.dumps(data)[:300])
    if path == "/v1/chat/completions" and not isinstance(choice.get("message"), dict):
        raise ApiError(service, path, 200, "response's choice has no message", json.dumps(data)[:300])
    return choice


def native_answer(data: Any, service: str) -> dict[str, Any]:
    """A /generate answer (the first of a batch) with its `meta_info` an object; anything else is an ApiError
    quoting it."""
    answer = data[0] if isinstance(data, list) and data else data
    if not isinstance(answer, dict):
        raise ApiError(service, "/generate", 200, f"response is {json_kind(data)}, not an object",
                       json.dumps(data)[:300])
    if not isinstance(answer.get("meta_info"), dict):
        raise ApiError(service, "/generate", 200, "response has no meta_info object",
                       json.dumps(answer)[:300])
    return answer


def native_generation(data: Any, elapsed: float, service: str) -> Generation:
    """One /generate answer as a `Generation`; what is wrong with one that is not is quoted as it came."""
    if not isinstance(data, dict):
        raise ApiError(service, "/generate", 200, f"response is {json_kind(data)}, not an object",
                       json.dumps(data)[:300])
    lacking = [key for key in ("text", "meta_info") if key not in data]
    if lacking or not isinstance(data["meta_info"], dict):
        problem = (f"response lacks {' and '.join(lacking)}" if lacking
                   else f"response's meta_info is {json_kind(data['meta_info'])}, not an object")
        raise ApiError(service, "/generate", 200, problem, json.dumps(data)[:300])
    meta = data["meta_info"]
    reason, matched = _finish(meta.get("finish_reason"))
    top = meta.get("output_top_logprobs")
    return Generation(
        text=str(data["text"]),
        finish_reason=reason,
        output_ids=list(data["output_ids"]) if isinstance(data.get("output_ids"), list) else None,
        matched_stop=matched,
        prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=meta.get("completion_tokens"),
        meta=meta,
        elapsed_s=elapsed,
        logprobs=_pairs(meta.get("output_token_logprobs")) if "output_token_logprobs" in meta else None,
        top_logprobs=[_pairs(step) for step in top] if isinstance(top, list) else None,
    )


def openai_generations(data: Any, elapsed: float, service: str, path: str, *, chat: bool) -> list[Generation]:
    if not isinstance(data, dict):
        raise ApiError(service, path, 200, f"response is {json_kind(data)}, not an object",
                       json.dumps(data)[:300])
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ApiError(service, path, 200, "response has no choices", json.dumps(data)[:300])
    usage = data.get("usage") or {}
    out = []
    for choice in choices:
        message = (choice.get("message") or {}) if chat else {}
        text = message.get("content") if chat else choice.get("text")
        thought = message.get("reasoning_content")
        out.append(
            Generation(
                text=text or "",
                reasoning=None if thought is None else str(thought),
                finish_reason=choice.get("finish_reason"),
                matched_stop=choice.get("matched_stop"),
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                meta={"usage": usage, "index": choice.get("index")},
                elapsed_s=elapsed,
            )
        )
    return out
