"""`InferenceClient`: one server's calls (models, server info, health, metrics, generations and streams), with
explicit timeouts, every failure mapped to `ApiError`, bodies read under their cap (client/bodies.py) and
every call bounded by its total time (client/deadline.py).

No retries, except on the metadata routes (/server_info, /model_info, /metrics and their older names): a
transient answer there (HTTP 5xx, 501 included; HTTP 429, a timeout, a dropped connection) is asked again,
after 0.25 s then doubling, within the call's own timeout, which stays its TOTAL time, retries included (10 s
by default; an attempt gets half of what is left while that is at least 2 x MIN_ATTEMPT_S, so a timed-out
attempt can be retried; a route's older name, asked after the newer one answered "not served", gets what is
left of that same total time: `metadata_first`): one 503 right after a restart must not turn a speculative
SGLang server into "not SGLang". Only "not served" answers (NOT_SERVED: 404, 405, 410; not 501, which SGLang
never answers) on every path mean that the server is not SGLang; anything else still wrong when the time is
spent is an ApiError."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx

from pytest_dflash.client.answers import (
    Answer,
    api_of,
    is_error_event,
    stream_tokens,
    streamed_answer,
    whole_answer,
    whole_answers,
)
from pytest_dflash.client.bodies import (
    DEFAULT_MAX_BODY,
    METRICS_MAX_BODY,
    STREAM_MAX_TOTAL,
    answer_json,
    error_message,
    requested_tokens,
    response_cap,
)
from pytest_dflash.client.connect import REUSE_IDLE_S, proxied, ssl_context, tcp_refused
from pytest_dflash.client.deadline import CallProgress, DeadlineExceeded, bound_total_time, deadline
from pytest_dflash.client.sampling import GREEDY, Generation, Sampling, Stream
from pytest_dflash.client.sse import DONE, SKIP, capped_lines, sse_event
from pytest_dflash.errors import ApiError

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
DROPPED = "connection dropped"
MIN_ATTEMPT_S = 3.0  # a metadata GET's attempt is never cut below this to leave time for a retry
# A route the server does not have (not a passing fault). SGLang's FastAPI app answers an unknown path 404
# (recorded on 0.5.17) and a wrong method 405; it never answers 501, so a 501 on a route SGLang always serves
# comes from something in between (a proxy or gateway: for a while, or for a method it does not forward) and
# says nothing about the server: a 5xx like any other, asked again, and "could not check" naming it if it
# stays.
NOT_SERVED = frozenset({404, 405, 410})
TRANSIENT_CAUSES = frozenset({"timeout", "dropped"})


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
        limit_name: str = "the client's default timeout",
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx does not retry: keep-alive is fine (SGLang is uvicorn) as long as idle connections retire
        # before the server closes them (REUSE_IDLE_S). One SSL context for every client: httpx would load the
        # CA bundle again for each (≈ 15 ms of CPU; 64 services of a fleet worker paid a second).
        self._http = bound_total_time(httpx.Client(base_url=base_url, timeout=timeout, headers=headers,
                                                   verify=ssl_context(),
                                                   limits=httpx.Limits(keepalive_expiry=REUSE_IDLE_S)))
        # A call's total deadline when it names none: the per-read timeout, now meant as total time.
        self.default_limit_s = timeout.read if timeout.read is not None else 60.0
        self.limit_name = limit_name  # how the default limit is documented ("--request-timeout")
        # told of every DeadlineExceeded before it is raised; returns more to say about it, or ""
        self.on_deadline: Callable[[DeadlineExceeded], str] | None = None
        # set once the service was failed (stuck, far too slow): later calls fail at once, naming why
        self.unusable: str | None = None
        self.base_url = base_url.rstrip("/")
        self.service = service
        self._model = model
        self.api_key = api_key
        # getaddrinfo of the server, resolved once (refuses_connections)
        self._addresses: list[Any] | None = None
        # httpx reads the proxy variables when the client is built; so does this (reading them costs 0.3 ms)
        self._proxied = proxied(self._http.base_url.host)

    def refuses_connections(self, timeout_s: float) -> bool | None:
        """Does nothing listen at the server's address any more? One TCP connect and close, no HTTP: after
        readiness a refusal is all a liveness check needs (conclusive), and an HTTP request costs the client
        ~30 times the CPU. None when a TCP connect would not tell: a proxy from the environment stands
        between (httpx sends through it, so its port says nothing of the server's) — ask over HTTP then."""
        url = self._http.base_url
        host = url.host
        if self._proxied:
            return None
        port = url.port or (443 if url.scheme == "https" else 80)
        if self._addresses is None:
            try:
                self._addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError:
                return None  # a name that stopped resolving is not a server that died
        return tcp_refused(self._addresses, timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _mapped(self, endpoint: str, progress: CallProgress | None = None) -> Iterator[None]:
        """Translate httpx's exceptions into ApiError (raised `from` the original); a timeout at or past the
        call's total deadline is a DeadlineExceeded saying how far the call got."""
        try:
            yield
        except DeadlineExceeded:
            raise
        except httpx.TimeoutException as exc:
            if progress is not None and progress.overdue and "ConnectTimeout" not in type(exc).__name__:
                raise self._deadline_error(endpoint, progress) from exc
            raise ApiError(self.service, endpoint, None, f"timed out ({type(exc).__name__})",
                           cause="timeout") from exc
        except httpx.RemoteProtocolError as exc:
            raise ApiError(self.service, endpoint, None, DROPPED, str(exc), cause="dropped") from exc
        except (httpx.ReadError, httpx.WriteError) as exc:
            raise ApiError(self.service, endpoint, None, f"{DROPPED} ({type(exc).__name__}: {exc})",
                           cause="dropped") from exc
        except httpx.ConnectError as exc:
            raise ApiError(self.service, endpoint, None, f"cannot connect: {exc}", cause="refused") from exc
        except httpx.HTTPError as exc:
            raise ApiError(self.service, endpoint, None, f"{type(exc).__name__}: {exc}") from exc

    def _timeout(self, seconds: float | None) -> httpx.Timeout | None:
        return None if seconds is None else httpx.Timeout(seconds, connect=min(5.0, seconds))

    def _progress(self, method: str, timeout_s: float | None, *, stream: bool = False) -> CallProgress:
        if self.unusable is not None:
            raise ApiError(self.service, "", None, f"not sent: the service was failed: {self.unusable}",
                           cause="unusable")
        limit = timeout_s if timeout_s is not None else self.default_limit_s
        started = time.monotonic()
        return CallProgress(started, started + limit, limit, stream=stream, method=method.upper())

    def _deadline_error(self, endpoint: str, progress: CallProgress) -> DeadlineExceeded:
        got, per_token = progress.describe()
        elapsed = time.monotonic() - progress.started
        where = self.limit_name if progress.limit_s == self.default_limit_s else "this call's timeout"
        error = DeadlineExceeded(
            self.service, endpoint, progress.status,
            f"timed out: no complete answer within {progress.limit_s:g}s ({where}, total time): got {got} "
            f"after {elapsed:.1f}s", cause="timeout", limit_s=progress.limit_s, elapsed_s=elapsed, got=got,
            tokens=progress.tokens if progress.stream else None, per_token_s=per_token, limit_name=where,
            method=progress.method)
        if self.on_deadline is not None:
            more = self.on_deadline(error)
            if more:
                error.message += f"; {more}"
        return error

    def _check_deadline(self, endpoint: str, progress: CallProgress) -> None:
        if progress.overdue:
            raise self._deadline_error(endpoint, progress)

    def request(
        self, method: str, path: str, *, json_body: Any = None, timeout_s: float | None = None,
        max_bytes: int | None = None,
    ) -> httpx.Response:
        """A raw request, its body read whole up to `max_bytes` (default: `response_cap(path, json_body)`).

        Raises ApiError when no HTTP response arrived, or when the body is over its cap (the body is
        then not read further; the error names the size seen and the cap).
        """
        cap = max_bytes if max_bytes is not None else response_cap(path, json_body)
        progress = self._progress(method, timeout_s)
        with self._mapped(path, progress), deadline(progress.limit_s), self._http.stream(
                method, path, json=json_body,
                timeout=self._timeout(timeout_s) or self._http.timeout) as response:
            progress.status = response.status_code
            return self._read_capped(response, path, cap, progress)

    def _read_capped(self, response: httpx.Response, path: str, cap: int,
                     progress: CallProgress | None = None) -> httpx.Response:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise self._too_large(path, response.status_code, cap, f"Content-Length {int(declared)} bytes",
                                  b"")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if progress is not None:
                progress.bytes = size
                self._check_deadline(path, progress)
            if size > cap:
                raise self._too_large(path, response.status_code, cap, f"{size}+ bytes read",
                                      b"".join(chunks))
            chunks.append(chunk)
        # A fresh, fully read response: the body is already decoded, so drop the framing headers.
        headers = [(k, v) for k, v in response.headers.multi_items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks),
                              request=response.request, extensions=response.extensions)

    def _too_large(self, path: str, status: int | None, cap: int, seen: str, head: bytes) -> ApiError:
        excerpt = head[:200].decode("utf-8", "replace")
        return ApiError(self.service, path, status,
                        f"response body too large: {seen}, over the {cap}-byte cap "
                        "for this request (the rest was not read)", excerpt, cause="too-large")

    def _json(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        response = self.request(method, path, json_body=body, timeout_s=timeout_s)
        if response.status_code >= 400:
            raise ApiError(self.service, path, response.status_code, error_message(response),
                           response.text[:500])
        return answer_json(response, self.service, path)

    # ---- informational endpoints ------------------------------------------------------------------

    def models(self, timeout_s: float | None = 10) -> list[str]:
        body = self._json("GET", "/v1/models", timeout_s=timeout_s)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ApiError(self.service, "/v1/models", 200, "response has no 'data' list",
                           json.dumps(body)[:300])
        return [str(item.get("id")) for item in data if isinstance(item, dict)]

    def model(self) -> str:
        if self._model is None:
            ids = self.models()
            self._model = ids[0] if ids else "default"
        return self._model

    def server_info(self, timeout_s: float | None = 10) -> dict[str, Any] | None:
        """SGLang's /server_info (or the older /get_server_info); None for a non-SGLang server."""
        return self._native_info(("/server_info", "/get_server_info"), timeout_s)

    def model_info(self, timeout_s: float | None = 10) -> dict[str, Any] | None:
        """SGLang's /model_info (or the older /get_model_info): model_path, tokenizer_path, ...; None if
        absent."""
        return self._native_info(("/model_info", "/get_model_info"), timeout_s)

    def _native_info(self, paths: tuple[str, ...], timeout_s: float | None) -> dict[str, Any] | None:
        """The first path's JSON object; None only when every path answered "not served" (NOT_SERVED)."""
        path, response = self.metadata_first(paths, timeout_s=timeout_s)
        if response.status_code in NOT_SERVED:
            return None
        if response.status_code != 200:
            raise ApiError(self.service, path, response.status_code, error_message(response),
                           response.text[:300])
        body = answer_json(response, self.service, path)
        if not isinstance(body, dict):
            raise ApiError(self.service, path, 200, "not a JSON object", response.text[:300])
        return body

    def metadata_first(self, paths: Sequence[str], *, timeout_s: float | None = None,
                       max_bytes: int | None = None) -> tuple[str, httpx.Response]:
        """GET each of `paths` in turn (a route's name, then its older names) until one answers other than
        "not served": that path and its answer (every path "not served": the last one's). ONE total deadline,
        `timeout_s`, for all of them: a later name gets what is left of it, never a deadline of its own (a
        newer name answering 404 late, then an older one never answering, must not double the wait)."""
        total = timeout_s if timeout_s is not None else self.default_limit_s
        deadline_at = time.monotonic() + total
        asked: list[str] = []
        for index, path in enumerate(paths):
            left = deadline_at - time.monotonic() if index else total
            if index and left <= 0:
                raise ApiError(self.service, path, None,
                               f"not asked: {', '.join(asked)} took the whole {total:g}s (total time) to "
                               "answer \"not served\"", cause="timeout")
            try:
                response = self.metadata_get(path, timeout_s=left, max_bytes=max_bytes)
            except ApiError as exc:
                if asked and exc.cause == "timeout":
                    exc.message += (f" (what was left of {total:g}s of total time after {', '.join(asked)} "
                                    "answered \"not served\")")
                raise
            asked.append(path)
            if response.status_code not in NOT_SERVED or index == len(paths) - 1:
                return path, response
        raise ValueError("metadata_first: no path to ask")

    def metadata_get(self, path: str, *, timeout_s: float | None = None,
                     max_bytes: int | None = None) -> httpx.Response:
        """GET a metadata route, asked again while its answer is transient (module docstring) and its total
        time `timeout_s` lasts; returns the last answer (any status; also when a later try, cut short by the
        deadline or dropped, got none: a 501 or 503 said is more than "timed out"), raises the last ApiError
        when no answer came at all."""
        total = timeout_s if timeout_s is not None else self.default_limit_s
        started = time.monotonic()
        pause, left = 0.25, total
        answered: httpx.Response | None = None
        while True:
            limit = left / 2 if left >= 2 * MIN_ATTEMPT_S else left
            try:
                response = self.request("GET", path, timeout_s=limit, max_bytes=max_bytes)
            except ApiError as exc:
                if exc.cause not in TRANSIENT_CAUSES:
                    raise
                if time.monotonic() - started + pause >= total:
                    if answered is not None:
                        return answered
                    raise
            else:
                answered = response
                transient = response.status_code == 429 or response.status_code >= 500
                if not transient or time.monotonic() - started + pause >= total:
                    return response
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
            left = max(0.1, total - (time.monotonic() - started))

    def health_generate(self, timeout_s: float = 30) -> int:
        return self.request("GET", "/health_generate", timeout_s=timeout_s).status_code

    def flush_cache(self, timeout_s: float = 30) -> int:
        return self.request("POST", "/flush_cache", timeout_s=timeout_s).status_code

    def metrics(self, timeout_s: float = 10) -> str:
        response = self.metadata_get("/metrics", timeout_s=timeout_s, max_bytes=METRICS_MAX_BODY)
        if response.status_code != 200:
            raise ApiError(self.service, "/metrics", response.status_code, error_message(response))
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
        # a batch-shaped answer to one prompt: its one entry
        return Generation(whole_answer(data, "generate", self.service), time.monotonic() - started)

    def generate_many(self, prompt: str | Sequence[int], sampling: Sampling, *,
                      timeout_s: float | None = None) -> list[Generation]:
        """/generate with n > 1: SGLang answers a list, one entry per sample."""
        body = self._generate_body(prompt, sampling, False, 0)
        started = time.monotonic()
        data = self._json("POST", "/generate", body, timeout_s)
        if data == []:  # n samples asked, none came: never an empty list of generations to judge
            raise ApiError(self.service, "/generate", 200,
                           f"response is an empty JSON list, not {sampling.n} samples", "[]")
        elapsed = time.monotonic() - started
        return [Generation(answer, elapsed) for answer in whole_answers(data, "generate", self.service)]

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
        elapsed = time.monotonic() - started
        return [Generation(answer, elapsed) for answer in whole_answers(data, "completions", self.service)]

    def chat(self, messages: Sequence[Mapping[str, str]], sampling: Sampling = GREEDY, *,
             timeout_s: float | None = None) -> list[Generation]:
        """OpenAI POST /v1/chat/completions; one Generation per choice."""
        body = {"model": self.model(), "messages": list(messages), **sampling.as_openai()}
        started = time.monotonic()
        data = self._json("POST", "/v1/chat/completions", body, timeout_s)
        elapsed = time.monotonic() - started
        return [Generation(answer, elapsed) for answer in whole_answers(data, "chat", self.service)]

    def stream(self, path: str, body: Mapping[str, Any], *, timeout_s: float | None = None,
               in_band_errors: bool = False) -> Stream:
        """POST with stream=true and read the SSE stream to its end, checking it is well formed.

        Raises ApiError for a non-2xx status, a line that is not `data: …`, an event that is not JSON, an
        event or a stream over its byte cap, or a dropped connection; an error event inside the stream too,
        unless `in_band_errors` (then it is `Stream.error` and the stream is read on to its end: SGLang sends
        [DONE] after it). `Stream.done` is False when the stream ended without [DONE].
        """
        started = time.monotonic()
        events: list[dict[str, Any]] = []
        arrival: list[float] = []
        raw: list[str] = []
        done = False
        error: dict[str, Any] | None = None
        payload_body = {**body, "stream": True}
        line_cap = response_cap(path, payload_body)
        # Every event carries at most the whole output; there are at most about as many events as tokens.
        total_cap = min(STREAM_MAX_TOTAL, line_cap * (requested_tokens(path, payload_body) + 16))
        progress = self._progress("POST", timeout_s, stream=True)

        def on_bytes(total: int) -> None:
            progress.bytes = total
            self._check_deadline(path, progress)

        with self._mapped(path, progress), deadline(progress.limit_s), self._http.stream(
                "POST", path, json=payload_body,
                timeout=self._timeout(timeout_s) or self._http.timeout) as response:
            progress.status = status = response.status_code
            if status >= 400:
                response = self._read_capped(response, path, DEFAULT_MAX_BODY, progress)
                raise ApiError(self.service, path, status, error_message(response), response.text[:500])
            content_type = response.headers.get("content-type", "")

            def too_large(cap: int, seen: str, head: bytes) -> Exception:
                return self._too_large(path, status, cap, seen, head)

            for line in capped_lines(response, line_cap, total_cap, on_bytes=on_bytes, too_large=too_large):
                raw.append(line)
                try:
                    event = sse_event(line)
                except ValueError as exc:
                    raise ApiError(self.service, path, status, str(exc)) from None
                if event is SKIP:
                    continue
                if done:
                    raise ApiError(self.service, path, status, f"data after [DONE]: {line[:200]!r}")
                if event == DONE:
                    done = True
                    continue
                assert isinstance(event, dict)
                if is_error_event(event):
                    if not in_band_errors:
                        raise ApiError(self.service, path, status, f"error event in stream: {line[5:305]}")
                    error = error or event
                    continue
                events.append(event)
                arrival.append(time.monotonic() - started)
                progress.events = len(events)
                progress.tokens_seen(stream_tokens(events, progress.tokens))
        return Stream(events, arrival, done, raw, time.monotonic() - started, status, content_type, error)

    def answer(self, path: str, body: Mapping[str, Any], *, timeout_s: float | None = None) -> Answer:
        """One generation request (streamed when `body` says `stream`) read as a typed `Answer` (choice 0):
        ApiError for an HTTP error or an answer of the wrong shape; an error event inside a stream is the
        answer's `error`, for the check to judge."""
        api = api_of(path)
        if body.get("stream"):
            got = self.stream(path, body, timeout_s=timeout_s, in_band_errors=True)
            return streamed_answer(got.events, api, done=got.done, error=got.error)
        data = self._json("POST", path, body, timeout_s)
        return whole_answer(data, api, self.service)

    def generate_stream(self, prompt: str, sampling: Sampling = GREEDY, *,
                        timeout_s: float | None = None) -> Stream:
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


