"""HTTP client for one inference server, in two dialects: OpenAI (/v1/*) and SGLang native (/generate).

Explicit timeouts, no retries, and every failure mapped to `ApiError` — including the one that
matters most on a dying SGLang server: a request that gets no HTTP response at all
(`ApiError.status is None`, message "connection dropped").
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_dflash.errors import ApiError

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
DROPPED = "connection dropped"


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters, rendered for either dialect."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    ignore_eos: bool = False

    @property
    def uses_sampling_kernel(self) -> bool:
        """True when SGLang routes this through FlashInfer's top-k/top-p sampling kernel (not torch)."""
        if self.temperature <= 0:
            return False
        return (self.top_k is not None and self.top_k > 1) or (self.top_p is not None and self.top_p < 1) or (
            self.min_p is not None and self.min_p > 0
        )

    def as_sglang(self) -> dict[str, Any]:
        params: dict[str, Any] = {"max_new_tokens": self.max_tokens, "temperature": self.temperature}
        for key, value in (("top_p", self.top_p), ("top_k", self.top_k), ("min_p", self.min_p),
                           ("sampling_seed", self.seed)):
            if value is not None:
                params[key] = value
        if self.stop:
            params["stop"] = list(self.stop)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.n != 1:
            params["n"] = self.n
        if self.ignore_eos:
            params["ignore_eos"] = True
        return params

    def as_openai(self) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        # top_k, min_p, stop_token_ids and ignore_eos are SGLang extensions of the OpenAI schema.
        for key, value in (("top_p", self.top_p), ("top_k", self.top_k), ("min_p", self.min_p), ("seed", self.seed)):
            if value is not None:
                body[key] = value
        if self.stop:
            body["stop"] = list(self.stop)
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        if self.n != 1:
            body["n"] = self.n
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


GREEDY = Sampling(max_tokens=8, temperature=0.0)
# top_k > 1 and top_p < 1: the request SGLang sends through FlashInfer's JIT-compiled sampling kernel.
SAMPLED = Sampling(max_tokens=8, temperature=0.8, top_k=20, top_p=0.9)


@dataclass
class Generation:
    """One completed generation, normalised across dialects."""

    text: str
    finish_reason: str | None
    output_ids: list[int] | None = None
    matched_stop: int | str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    logprobs: list[tuple[float, int]] | None = None
    top_logprobs: list[list[tuple[float, int]]] | None = None

    @property
    def accept_length(self) -> float | None:
        value = self.meta.get("spec_accept_length")
        return float(value) if isinstance(value, int | float) else None

    @property
    def verify_ct(self) -> int | None:
        value = self.meta.get("spec_verify_ct")
        return int(value) if isinstance(value, int | float) else None


@dataclass
class Stream:
    """A completed SSE stream: the decoded events, when each arrived, and whether [DONE] came."""

    events: list[dict[str, Any]]
    arrival_s: list[float]
    done: bool
    raw_lines: list[str]
    elapsed_s: float
    status: int = 200
    content_type: str = ""


class InferenceClient:
    """One server, two dialects: OpenAI (/v1/*) and SGLang native (/generate, /server_info)."""

    def __init__(
        self,
        base_url: str,
        *,
        service: str = "server",
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        api_key: str | None = None,
        model: str | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx does not retry; keep-alive is fine (SGLang is uvicorn).
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers)
        self.base_url = base_url.rstrip("/")
        self.service = service
        self._model = model
        self.api_key = api_key

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _mapped(self, endpoint: str) -> Iterator[None]:
        """Translate httpx's exceptions into ApiError (raised `from` the original)."""
        try:
            yield
        except httpx.RemoteProtocolError as exc:
            raise ApiError(self.service, endpoint, None, DROPPED, str(exc)) from exc
        except (httpx.ReadError, httpx.WriteError) as exc:
            raise ApiError(self.service, endpoint, None, f"{DROPPED} ({type(exc).__name__}: {exc})") from exc
        except httpx.ConnectError as exc:
            raise ApiError(self.service, endpoint, None, f"cannot connect: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise ApiError(self.service, endpoint, None, f"timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise ApiError(self.service, endpoint, None, f"{type(exc).__name__}: {exc}") from exc

    def _timeout(self, seconds: float | None) -> httpx.Timeout | None:
        return None if seconds is None else httpx.Timeout(seconds, connect=min(5.0, seconds))

    def request(
        self, method: str, path: str, *, json_body: Any = None, timeout_s: float | None = None
    ) -> httpx.Response:
        """A raw request; raises ApiError only when no HTTP response arrived."""
        with self._mapped(path):
            return self._http.request(method, path, json=json_body, timeout=self._timeout(timeout_s) or
                                      self._http.timeout)

    def _json(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        response = self.request(method, path, json_body=body, timeout_s=timeout_s)
        if response.status_code >= 400:
            raise ApiError(self.service, path, response.status_code, _error_message(response), response.text[:500])
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(self.service, path, response.status_code, f"malformed JSON body: {exc}",
                           response.text[:500]) from exc

    # ---- informational endpoints ------------------------------------------------------------------

    def models(self, timeout_s: float | None = 10) -> list[str]:
        body = self._json("GET", "/v1/models", timeout_s=timeout_s)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ApiError(self.service, "/v1/models", 200, "response has no 'data' list", json.dumps(body)[:300])
        return [str(item.get("id")) for item in data if isinstance(item, dict)]

    def model(self) -> str:
        if self._model is None:
            ids = self.models()
            self._model = ids[0] if ids else "default"
        return self._model

    def server_info(self, timeout_s: float | None = 10) -> dict[str, Any] | None:
        """SGLang's /server_info (or the older /get_server_info); None for a non-SGLang server."""
        for path in ("/server_info", "/get_server_info"):
            response = self.request("GET", path, timeout_s=timeout_s)
            if response.status_code == 200:
                try:
                    body = response.json()
                except json.JSONDecodeError as exc:
                    raise ApiError(self.service, path, 200, f"malformed JSON body: {exc}", response.text[:300]) from exc
                return body if isinstance(body, dict) else None
        return None

    def health_generate(self, timeout_s: float = 30) -> int:
        return self.request("GET", "/health_generate", timeout_s=timeout_s).status_code

    def flush_cache(self, timeout_s: float = 30) -> int:
        return self.request("POST", "/flush_cache", timeout_s=timeout_s).status_code

    def metrics(self, timeout_s: float = 10) -> str:
        response = self.request("GET", "/metrics", timeout_s=timeout_s)
        if response.status_code != 200:
            raise ApiError(self.service, "/metrics", response.status_code, _error_message(response))
        return response.text

    # ---- generation ------------------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[int],
        sampling: Sampling = GREEDY,
        *,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        timeout_s: float | None = None,
    ) -> Generation:
        """SGLang native POST /generate with one prompt (text or token ids)."""
        body = self._generate_body(prompt, sampling, return_logprob, top_logprobs_num)
        started = time.monotonic()
        data = self._json("POST", "/generate", body, timeout_s)
        if isinstance(data, list):
            data = data[0] if data else {}
        return _native_generation(data, time.monotonic() - started, self.service)

    def generate_many(self, prompt: str | Sequence[int], sampling: Sampling, *,
                      timeout_s: float | None = None) -> list[Generation]:
        """/generate with n > 1: SGLang answers a list, one entry per sample."""
        body = self._generate_body(prompt, sampling, False, 0)
        started = time.monotonic()
        data = self._json("POST", "/generate", body, timeout_s)
        items = data if isinstance(data, list) else [data]
        return [_native_generation(item, time.monotonic() - started, self.service) for item in items]

    def _generate_body(self, prompt: str | Sequence[int], sampling: Sampling, return_logprob: bool,
                       top_logprobs_num: int) -> dict[str, Any]:
        body: dict[str, Any] = {"sampling_params": sampling.as_sglang()}
        if isinstance(prompt, str):
            body["text"] = prompt
        else:
            body["input_ids"] = list(prompt)
        if return_logprob:
            body["return_logprob"] = True
            body["top_logprobs_num"] = top_logprobs_num
        return body

    def completion(self, prompt: str, sampling: Sampling = GREEDY, *,
                   timeout_s: float | None = None) -> list[Generation]:
        """OpenAI POST /v1/completions; one Generation per choice."""
        body = {"model": self.model(), "prompt": prompt, **sampling.as_openai()}
        started = time.monotonic()
        data = self._json("POST", "/v1/completions", body, timeout_s)
        return _openai_generations(data, time.monotonic() - started, self.service, "/v1/completions", chat=False)

    def chat(self, messages: Sequence[Mapping[str, str]], sampling: Sampling = GREEDY, *,
             timeout_s: float | None = None) -> list[Generation]:
        """OpenAI POST /v1/chat/completions; one Generation per choice."""
        body = {"model": self.model(), "messages": list(messages), **sampling.as_openai()}
        started = time.monotonic()
        data = self._json("POST", "/v1/chat/completions", body, timeout_s)
        return _openai_generations(data, time.monotonic() - started, self.service, "/v1/chat/completions", chat=True)

    def stream(self, path: str, body: Mapping[str, Any], *, timeout_s: float | None = None) -> Stream:
        """POST with stream=true and read the SSE stream to its end, checking it is well formed.

        Raises ApiError for a non-2xx status, a line that is not `data: …`, an event that is not
        JSON, or a dropped connection; `Stream.done` is False when the stream ended without [DONE].
        """
        started = time.monotonic()
        events: list[dict[str, Any]] = []
        arrival: list[float] = []
        raw: list[str] = []
        done = False
        with self._mapped(path), self._http.stream("POST", path, json={**body, "stream": True},
                                                   timeout=self._timeout(timeout_s) or self._http.timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError(self.service, path, response.status_code, _error_message(response), response.text[:500])
            content_type = response.headers.get("content-type", "")
            for line in response.iter_lines():
                raw.append(line)
                if not line.strip():
                    continue
                if done:
                    raise ApiError(self.service, path, response.status_code, f"data after [DONE]: {line[:200]!r}")
                if not line.startswith("data:"):
                    raise ApiError(self.service, path, response.status_code, f"malformed SSE line: {line[:200]!r}")
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    continue
                try:
                    event = json.loads(payload)
                except json.JSONDecodeError as exc:
                    raise ApiError(self.service, path, response.status_code,
                                   f"SSE event is not JSON ({exc}): {payload[:200]!r}") from exc
                if not isinstance(event, dict):
                    raise ApiError(self.service, path, response.status_code,
                                   f"SSE event is not an object: {payload[:200]!r}")
                if "error" in event and not event.get("choices") and "text" not in event:
                    raise ApiError(self.service, path, response.status_code, f"error event in stream: {payload[:300]}")
                events.append(event)
                arrival.append(time.monotonic() - started)
        return Stream(events, arrival, done, raw, time.monotonic() - started, response.status_code, content_type)

    def generate_stream(self, prompt: str, sampling: Sampling = GREEDY, *, timeout_s: float | None = None) -> Stream:
        return self.stream("/generate", self._generate_body(prompt, sampling, False, 0), timeout_s=timeout_s)

    def completion_stream(self, prompt: str, sampling: Sampling = GREEDY, *, include_usage: bool = True,
                          timeout_s: float | None = None) -> Stream:
        body = {"model": self.model(), "prompt": prompt, **sampling.as_openai()}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        return self.stream("/v1/completions", body, timeout_s=timeout_s)

    def chat_stream(self, messages: Sequence[Mapping[str, str]], sampling: Sampling = GREEDY, *,
                    include_usage: bool = True, timeout_s: float | None = None) -> Stream:
        body = {"model": self.model(), "messages": list(messages), **sampling.as_openai()}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        return self.stream("/v1/chat/completions", body, timeout_s=timeout_s)

    def probe_generation(self, sampling: Sampling, *, native: bool, timeout_s: float) -> Generation:
        """A minimal generation for readiness: native /generate, else /v1/completions."""
        if native:
            return self.generate("Hello", sampling, timeout_s=timeout_s)
        return self.completion("Hello", sampling, timeout_s=timeout_s)[0]


def _error_message(response: httpx.Response) -> str:
    """The human message of an SGLang/OpenAI error body ({"error":{"message"}}, {"message"}, {"detail"})."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:300] or response.reason_phrase
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


def _native_generation(data: Any, elapsed: float, service: str) -> Generation:
    if not isinstance(data, dict) or "text" not in data or not isinstance(data.get("meta_info"), dict):
        raise ApiError(service, "/generate", 200, "response lacks text/meta_info", json.dumps(data)[:300])
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


def _openai_generations(data: Any, elapsed: float, service: str, path: str, *, chat: bool) -> list[Generation]:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        raise ApiError(service, path, 200, "response has no choices", json.dumps(data)[:300])
    usage = data.get("usage") or {}
    out = []
    for choice in choices:
        text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
        out.append(
            Generation(
                text=text or "",
                finish_reason=choice.get("finish_reason"),
                matched_stop=choice.get("matched_stop"),
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                meta={"usage": usage, "index": choice.get("index")},
                elapsed_s=elapsed,
            )
        )
    return out
