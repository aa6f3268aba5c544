"""HTTP client for one inference server, in two dialects: OpenAI (/v1/*) and SGLang native (/generate).

Explicit timeouts, no retries, and every failure mapped to `ApiError` — including the one that
matters most on a dying SGLang server: a request that gets no HTTP response at all
(`ApiError.status is None`, message "connection dropped").

Bodies are read with a byte cap (`response_cap`): a generation's cap follows from what the request
allows (max_tokens × n × prompts, logprobs), everything else gets `DEFAULT_MAX_BODY`, `/metrics`
`METRICS_MAX_BODY`. A body over its cap fails with its size (`ApiError.cause == "too-large"`) and is
never read whole, so a server answering megabytes to max_tokens=4 cannot fill memory or the reports.

Every request and every stream is bounded by TOTAL time, not only per read (httpx's timeouts are per
read: a server that drips a byte, a blank line or an SSE comment every 2 s would hold a call forever).
The deadline is the call's `timeout_s`, else the client's read timeout (the run's `--request-timeout`).
It is enforced below httpx, on every socket operation (connect, write, each read is given at most the
time left), so it covers response headers as well as the body; the body and SSE loops check it between
chunks too. Running out of it raises `DeadlineExceeded` (an `ApiError`, cause "timeout") naming the
endpoint, the limit and how far the call got (no response headers / status and bytes / SSE events and
tokens, seconds per token). `on_deadline`, when set (run/state.py), is told first and may add what it
found out about the server (is the engine still making progress?) to the error's message.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from pytest_dflash.errors import ApiError

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
DROPPED = "connection dropped"

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


_SSL_LOCK = threading.Lock()
_SSL: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    """httpx's own default context (its CA bundle, SSL_CERT_FILE / SSL_CERT_DIR), built once per process."""
    global _SSL
    with _SSL_LOCK:
        if _SSL is None:
            _SSL = httpx.create_ssl_context()
        return _SSL


def _proxied(host: str) -> bool:
    """Would httpx (trust_env) send a request for `host` through a proxy named in the environment?"""
    proxies = urllib.request.getproxies()
    return any(proxies.get(k) for k in ("http", "https", "all")) and not urllib.request.proxy_bypass(host)


# ---- total deadlines, enforced below httpx ---------------------------------------------------------------------


class _Deadline(threading.local):
    """The monotonic time by which this thread's current call must be done (None: no call in progress)."""

    at: float | None = None


_DEADLINE = _Deadline()


def _time_left(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout` (a per-operation timeout) cut to the time left before this thread's deadline."""
    at = _DEADLINE.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the call's total deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every operation gets at most the time left before the calling thread's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     _time_left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network backend with the calling thread's deadline applied to every connection it makes."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port, _time_left(timeout, httpcore.ConnectTimeout),
                                                       local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, _time_left(timeout, httpcore.ConnectTimeout),
                                                               socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bound_total_time(client: httpx.Client) -> httpx.Client:
    """Give every connection `client` makes (directly or through an environment proxy) the calling thread's
    deadline. httpx has no public hook below its per-read timeouts, so this wraps the network backend of
    each httpcore pool; it fails loudly if a new httpx moved it (a call without a deadline must not pass)."""
    transports = [client._transport, *(t for t in client._mounts.values() if t is not None)]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if not isinstance(backend, httpcore.NetworkBackend):
            raise RuntimeError(f"httpx {httpx.__version__}: cannot bound the total time of HTTP calls "
                               f"({type(transport).__name__} has no httpcore pool with a network backend)")
        if not isinstance(backend, _DeadlineBackend):
            pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]
    return client


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Bound every HTTP operation of this thread (on a `bound_total_time` client) to `seconds` from now, in all;
    yields the monotonic deadline. An inner deadline never extends an outer one."""
    outer = _DEADLINE.at
    at = time.monotonic() + seconds
    _DEADLINE.at = at if outer is None else min(at, outer)
    try:
        yield _DEADLINE.at
    finally:
        _DEADLINE.at = outer


@dataclass(eq=False)
class DeadlineExceeded(ApiError):
    """A call ran out of its total time: the endpoint, the limit, and how far it got."""

    limit_s: float = 0.0
    elapsed_s: float = 0.0
    got: str = ""  # "no HTTP response headers", "HTTP 200 and 120 bytes of body", "5 SSE events, 4 tokens …"
    tokens: int | None = None  # tokens seen in a stream (None: not a stream, or nothing countable)
    per_token_s: float | None = None  # seconds per token over the tokens seen (None: fewer than one)
    limit_name: str = ""  # where the limit comes from: "--request-timeout", "timeout_s", …
    method: str = ""


@dataclass
class _Progress:
    """How far one call got, for the error that says so when it runs out of time."""

    started: float
    deadline: float
    limit_s: float
    status: int | None = None
    bytes: int = 0
    events: int = 0
    tokens: int = 0
    token_times: list[float] = field(default_factory=list)  # seconds from the start at which tokens arrived
    stream: bool = False
    method: str = "GET"

    @property
    def overdue(self) -> bool:
        # a socket timeout cut to the deadline may fire a hair before it (poll's millisecond resolution)
        return time.monotonic() >= self.deadline - 0.01

    def tokens_seen(self, count: int) -> None:
        if count > self.tokens:
            now = time.monotonic() - self.started
            self.token_times.extend([now] * (count - self.tokens))
            self.tokens = count

    def describe(self) -> tuple[str, float | None]:
        """What the call got, in words; and seconds per token (None: under one token)."""
        if self.status is None:
            return "nothing (not even the response headers)", None
        if not self.stream:
            return f"HTTP {self.status} headers and {self.bytes} bytes of body, not the whole body", None
        if not self.tokens:
            return (f"HTTP {self.status}, {self.bytes} bytes in {self.events} SSE events, no token at all: the "
                    "stream never carried a token"), None
        first = self.token_times[0]
        # the pace of decoding: between the first token and the last (the first one also waited for the prefill)
        per_token = ((self.token_times[-1] - first) / (self.tokens - 1) if self.tokens > 1
                     else time.monotonic() - self.started)
        return (f"HTTP {self.status}, {self.tokens} tokens in {self.events} SSE events, {per_token:.2f} s per "
                f"token (first after {first:.1f} s)"), per_token


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
        limit_name: str = "the client's default timeout",
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx does not retry; keep-alive is fine (SGLang is uvicorn). One SSL context for every client: httpx
        # would load the CA bundle again for each (≈ 15 ms of CPU; 64 services of a fleet worker paid a second).
        self._http = bound_total_time(httpx.Client(base_url=base_url, timeout=timeout, headers=headers,
                                                   verify=_ssl_context()))
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
        self._addresses: list[Any] | None = None  # getaddrinfo of the server, resolved once (refuses_connections)
        # httpx reads the proxy variables when the client is built; so does this (reading them costs 0.3 ms)
        self._proxied = _proxied(self._http.base_url.host)

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
        refused = False
        for family, kind, proto, _, address in self._addresses:
            try:
                with socket.socket(family, kind, proto) as probe:
                    probe.settimeout(timeout_s)
                    probe.connect(address)
                return False
            except ConnectionRefusedError:
                refused = True
            except OSError:
                pass  # unreachable, timed out: not conclusive
        return refused if refused else None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _mapped(self, endpoint: str, progress: _Progress | None = None) -> Iterator[None]:
        """Translate httpx's exceptions into ApiError (raised `from` the original); a timeout at or past the
        call's total deadline is a DeadlineExceeded saying how far the call got."""
        try:
            yield
        except DeadlineExceeded:
            raise
        except httpx.TimeoutException as exc:
            if progress is not None and progress.overdue and "ConnectTimeout" not in type(exc).__name__:
                raise self._deadline_error(endpoint, progress) from exc
            raise ApiError(self.service, endpoint, None, f"timed out ({type(exc).__name__})", cause="timeout") from exc
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

    def _progress(self, method: str, timeout_s: float | None, *, stream: bool = False) -> _Progress:
        if self.unusable is not None:
            raise ApiError(self.service, "", None, f"not sent: the service was failed: {self.unusable}",
                           cause="unusable")
        limit = timeout_s if timeout_s is not None else self.default_limit_s
        started = time.monotonic()
        return _Progress(started, started + limit, limit, stream=stream, method=method.upper())

    def _deadline_error(self, endpoint: str, progress: _Progress) -> DeadlineExceeded:
        got, per_token = progress.describe()
        elapsed = time.monotonic() - progress.started
        where = self.limit_name if progress.limit_s == self.default_limit_s else "this call's timeout"
        error = DeadlineExceeded(
            self.service, endpoint, progress.status,
            f"timed out: no complete answer within {progress.limit_s:g}s ({where}, total time): got {got} after "
            f"{elapsed:.1f}s", cause="timeout", limit_s=progress.limit_s, elapsed_s=elapsed, got=got,
            tokens=progress.tokens if progress.stream else None, per_token_s=per_token, limit_name=where,
            method=progress.method)
        if self.on_deadline is not None:
            more = self.on_deadline(error)
            if more:
                error.message += f"; {more}"
        return error

    def _check_deadline(self, endpoint: str, progress: _Progress) -> None:
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
                method, path, json=json_body, timeout=self._timeout(timeout_s) or self._http.timeout) as response:
            progress.status = response.status_code
            return self._read_capped(response, path, cap, progress)

    def _read_capped(self, response: httpx.Response, path: str, cap: int,
                     progress: _Progress | None = None) -> httpx.Response:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise self._too_large(path, response.status_code, cap, f"Content-Length {int(declared)} bytes", b"")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if progress is not None:
                progress.bytes = size
                self._check_deadline(path, progress)
            if size > cap:
                raise self._too_large(path, response.status_code, cap, f"{size}+ bytes read", b"".join(chunks))
            chunks.append(chunk)
        # A fresh, fully read response: the body is already decoded, so drop the framing headers.
        headers = [(k, v) for k, v in response.headers.multi_items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks),
                              request=response.request, extensions=response.extensions)

    def _too_large(self, path: str, status: int | None, cap: int, seen: str, head: bytes) -> ApiError:
        excerpt = head[:200].decode("utf-8", "replace")
        return ApiError(self.service, path, status, f"response body too large: {seen}, over the {cap}-byte cap "
                        "for this request (the rest was not read)", excerpt, cause="too-large")

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
        return self._native_info(("/server_info", "/get_server_info"), timeout_s)

    def model_info(self, timeout_s: float | None = 10) -> dict[str, Any] | None:
        """SGLang's /model_info (or the older /get_model_info): model_path, tokenizer_path, ...; None if absent."""
        return self._native_info(("/model_info", "/get_model_info"), timeout_s)

    def _native_info(self, paths: tuple[str, ...], timeout_s: float | None) -> dict[str, Any] | None:
        for path in paths:
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
        response = self.request("GET", "/metrics", timeout_s=timeout_s, max_bytes=METRICS_MAX_BODY)
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
        JSON, an event or a stream over its byte cap, or a dropped connection; `Stream.done` is False
        when the stream ended without [DONE].
        """
        started = time.monotonic()
        events: list[dict[str, Any]] = []
        arrival: list[float] = []
        raw: list[str] = []
        done = False
        payload_body = {**body, "stream": True}
        line_cap = response_cap(path, payload_body)
        # Every event carries at most the whole output; there are at most about as many events as tokens.
        total_cap = min(STREAM_MAX_TOTAL, line_cap * (_requested_tokens(path, payload_body) + 16))
        progress = self._progress("POST", timeout_s, stream=True)
        with self._mapped(path, progress), deadline(progress.limit_s), self._http.stream(
                "POST", path, json=payload_body, timeout=self._timeout(timeout_s) or self._http.timeout) as response:
            progress.status = response.status_code
            if response.status_code >= 400:
                response = self._read_capped(response, path, DEFAULT_MAX_BODY, progress)
                raise ApiError(self.service, path, response.status_code, _error_message(response), response.text[:500])
            content_type = response.headers.get("content-type", "")
            for line in self._capped_lines(response, path, line_cap, total_cap, progress):
                raw.append(line)
                if not line.strip() or line.startswith(":"):
                    continue  # blank lines end events; ':' lines are SSE comments (a proxy's keep-alive pings)
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
                progress.events = len(events)
                progress.tokens_seen(_stream_tokens(events, progress.tokens))
        return Stream(events, arrival, done, raw, time.monotonic() - started, response.status_code, content_type)

    def _capped_lines(self, response: httpx.Response, path: str, line_cap: int, total_cap: int,
                      progress: _Progress) -> Iterator[str]:
        """`response.iter_lines()` (str.splitlines semantics, as httpx), failing on a line or a total over its cap,
        or when the call's total deadline passes (blank lines and SSE comments do not buy time)."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        total = 0
        for chunk in response.iter_bytes():
            total += len(chunk)
            progress.bytes = total
            self._check_deadline(path, progress)
            if total > total_cap:
                raise self._too_large(path, response.status_code, total_cap, f"stream of {total}+ bytes", b"")
            text = pending + decoder.decode(chunk)
            hold_cr = text.endswith("\r")  # "\r\n" may be split across chunks: decide with the next one
            if hold_cr:
                text = text[:-1]
            lines = text.splitlines()
            pending = lines.pop() if lines and text[-1:] not in _NEWLINES else ""
            if hold_cr:
                pending += "\r"
            if len(pending) > line_cap:
                raise self._too_large(path, response.status_code, line_cap, f"an SSE line of {len(pending)}+ bytes",
                                      pending[:200].encode())
            for line in lines:
                if len(line) > line_cap:
                    raise self._too_large(path, response.status_code, line_cap, f"an SSE line of {len(line)} bytes",
                                          line[:200].encode())
                yield line
        rest = (pending + decoder.decode(b"", final=True)).splitlines()
        yield from rest

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


def _stream_tokens(events: list[dict[str, Any]], before: int) -> int:
    """Tokens streamed so far: native /generate events carry the cumulative output_ids (or completion_tokens);
    OpenAI chunks carry one delta each (a chunk with text or content counts one token, at least)."""
    last = events[-1]
    if isinstance(last.get("output_ids"), list):
        return len(last["output_ids"])
    meta = last.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("completion_tokens"), int):
        return int(meta["completion_tokens"])
    usage = last.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int) and not last.get("choices"):
        return max(before, int(usage["completion_tokens"]))
    for choice in last.get("choices") or []:
        if isinstance(choice, dict) and (choice.get("text") or (choice.get("delta") or {}).get("content")):
            return before + 1
    return before


_NEWLINES = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines splits on


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


def _requested_tokens(path: str, body: Any) -> int:
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
    tokens = _requested_tokens(path, body)
    if not tokens or not isinstance(body, dict):
        return DEFAULT_MAX_BODY
    top = max(_count(body.get("top_logprobs_num")), _count(body.get("top_logprobs")), _count(body.get("logprobs")))
    per_token = _PER_TOKEN + top * _PER_TOP_LOGPROB
    request_size = len(json.dumps(body, default=str))
    # return_logprob / echo can add an entry per prompt token; a prompt has at most one token per byte.
    prompt_entries = request_size if body.get("return_logprob") or body.get("echo") else 0
    return _BASE_BODY + 2 * request_size + (tokens + prompt_entries) * per_token


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
