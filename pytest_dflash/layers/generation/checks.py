"""Generation-layer checks: each one sends real requests and raises AssertionError with the evidence.

Suites call these; they hold the logic so it can be tested against real servers. (One module over 600
lines on purpose: the suite's checklist is this file's list of functions, each short.) Every check speaks
one API flavour: SGLang's native ``/generate`` ("generate", token ids visible) or the OpenAI
endpoints ("completions", "chat"). A server that is not SGLang has no native flavour.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import pytest

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import GREEDY, SAMPLED, Generation, Sampling, Stream
from pytest_dflash.config.profiles import AUTO
from pytest_dflash.errors import ApiError, DflashError

if TYPE_CHECKING:
    from pytest_dflash.run.state import ServiceHandle

Api = Literal["generate", "completions", "chat"]
APIS: tuple[Api, ...] = ("generate", "completions", "chat")
PATHS: dict[Api, str] = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}

PROMPT = "The quick brown fox"
# Open-ended, so that a correctly sampled continuation varies from seed to seed on any model.
SEED_PROMPT = "Here is a random sequence of numbers between 0 and 999, separated by commas:"
# SGLang logs this once at start-up when sgl_kernel lacks tree_speculative_sampling_target_only.
GREEDY_FALLBACK_LINE = re.compile(r"[^\n]*falling back to greedy argmax verification[^\n]*")

# Sampling configurations of the sampled-generation test: each knob alone, then all together.
SAMPLING_CASES: dict[str, Sampling] = {
    "temperature": Sampling(max_tokens=16, temperature=0.7, ignore_eos=True),
    "top_k": Sampling(max_tokens=16, temperature=0.8, top_k=20, ignore_eos=True),
    "top_p": Sampling(max_tokens=16, temperature=0.8, top_p=0.9, ignore_eos=True),
    "min_p": Sampling(max_tokens=16, temperature=0.8, min_p=0.05, ignore_eos=True),
    "all+seed": Sampling(max_tokens=16, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=7, ignore_eos=True),
}


def _fail(message: str) -> NoReturn:
    __tracebackhide__ = True
    raise AssertionError(message)


def require_api(native: bool, api: Api) -> str | None:
    """Why `api` cannot be used on this server, or None."""
    if api == "generate" and not native:
        return "SGLang's native /generate is not served here (not an SGLang server)"
    return None


def use_api(service: ServiceHandle, api: Api) -> None:
    """Skip the test when `service` cannot speak `api` (the reason from require_api)."""
    reason = require_api(service.native, api)
    if reason:
        pytest.skip(reason)


def default_api(service: ServiceHandle) -> Api:
    """SGLang's native /generate where served, else the OpenAI completions endpoint."""
    return "generate" if service.native else "completions"


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


def _generate(client: InferenceClient, prompt: str, sampling: Sampling, *, native: bool,
              timeout_s: float | None = None) -> Generation:
    return request(client, "generate" if native else "completions", prompt, sampling, timeout_s=timeout_s)[0]


# ---- shapes ------------------------------------------------------------------------------------------


def check_completion_shape(gen: Generation, sampling: Sampling, *, what: str) -> None:
    """A finished generation: tokens counted, a finish reason that fits max_tokens."""
    __tracebackhide__ = True
    if gen.finish_reason not in ("length", "stop"):
        _fail(f"{what}: finish_reason {gen.finish_reason!r}, expected 'length' or 'stop' (meta: {gen.meta})")
    if gen.completion_tokens is None or gen.completion_tokens <= 0:
        _fail(f"{what}: completion_tokens = {gen.completion_tokens!r}; a generation must produce tokens")
    if gen.completion_tokens > sampling.max_tokens:
        _fail(f"{what}: {gen.completion_tokens} tokens for max_tokens={sampling.max_tokens}")
    if gen.finish_reason == "length" and gen.completion_tokens != sampling.max_tokens:
        _fail(f"{what}: finish_reason 'length' after {gen.completion_tokens} of {sampling.max_tokens} tokens")
    if gen.output_ids is not None and len(gen.output_ids) != gen.completion_tokens:
        _fail(f"{what}: {len(gen.output_ids)} output_ids but completion_tokens = {gen.completion_tokens}")


def check_full_length(gens: Sequence[Generation], sampling: Sampling, *, what: str) -> None:
    """With ignore_eos every sample must run to max_tokens and say so ('length')."""
    __tracebackhide__ = True
    if sampling.n > 1 and len(gens) != sampling.n:
        _fail(f"{what}: {len(gens)} samples for n={sampling.n}")
    per_choice = len(gens) == 1 or gens[0].output_ids is not None
    for index, gen in enumerate(gens):
        label = f"{what} (sample {index})" if len(gens) > 1 else what
        if gen.finish_reason != "length":
            _fail(f"{label}: finish_reason {gen.finish_reason!r} with ignore_eos and max_tokens={sampling.max_tokens}"
                  f", expected 'length' (text {gen.text[:80]!r})")
        if per_choice:
            check_completion_shape(gen, sampling, what=label)
    if not per_choice:  # OpenAI: usage counts all choices together
        tokens = gens[0].completion_tokens
        if tokens != sampling.max_tokens * len(gens):
            _fail(f"{what}: usage.completion_tokens = {tokens} for {len(gens)} choices of {sampling.max_tokens} "
                  "tokens each")
        indices = sorted(int(g.meta["index"]) for g in gens if isinstance(g.meta.get("index"), int))
        if indices != list(range(len(gens))):
            _fail(f"{what}: choice indices {indices}, expected 0..{len(gens) - 1}")


# ---- greedy and sampled --------------------------------------------------------------------------------


def greedy(client: InferenceClient, *, native: bool, max_tokens: int = 16, api: Api | None = None) -> Generation:
    """One greedy generation, checked; returns it."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    flavour: Api = api or ("generate" if native else "completions")
    gen = request(client, flavour, PROMPT, sampling)[0]
    check_completion_shape(gen, sampling, what=f"greedy generation ({PATHS[flavour]})")
    if gen.finish_reason != "length":
        _fail(f"greedy generation ({PATHS[flavour]}): finish_reason {gen.finish_reason!r} with ignore_eos, "
              "expected 'length'")
    return gen


def sampled(client: InferenceClient, *, native: bool, seed: int | None = None, max_tokens: int = 16,
            timeout_s: float | None = None) -> Generation:
    """One sampled generation through the top-k/top-p kernel (the request that killed seed 004's server)."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=SAMPLED.temperature, top_k=SAMPLED.top_k,
                        top_p=SAMPLED.top_p, seed=seed, ignore_eos=True)
    gen = _generate(client, PROMPT, sampling, native=native, timeout_s=timeout_s)
    check_completion_shape(gen, sampling, what="sampled generation (temperature 0.8, top_k 20, top_p 0.9)")
    return gen


def sampled_case(client: InferenceClient, api: Api, case: str) -> list[Generation]:
    """A sampled request with one of SAMPLING_CASES, checked to run to max_tokens."""
    __tracebackhide__ = True
    sampling = SAMPLING_CASES[case]
    gens = request(client, api, PROMPT, sampling)
    check_full_length(gens, sampling, what=f"sampled generation [{case}: {describe_sampling(sampling)}] "
                                           f"({PATHS[api]})")
    return gens


def describe_sampling(sampling: Sampling) -> str:
    parts = [f"temperature {sampling.temperature:g}"]
    for name in ("top_k", "top_p", "min_p", "seed"):
        value = getattr(sampling, name)
        if value is not None:
            parts.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    if sampling.n != 1:
        parts.append(f"n {sampling.n}")
    return ", ".join(parts)


def n_samples(client: InferenceClient, api: Api, *, n: int = 3, max_tokens: int = 12) -> list[Generation]:
    """n > 1 at temperature 1: n complete samples (and, natively, n distinct requests)."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=max_tokens, temperature=1.0, n=n, seed=11, ignore_eos=True)
    gens = request(client, api, PROMPT, sampling)
    check_full_length(gens, sampling, what=f"n={n} generation ({PATHS[api]})")
    return gens


def max_tokens_boundary(client: InferenceClient, api: Api, *, limits: Sequence[int] = (1, 7)) -> None:
    """max_tokens N with ignore_eos: exactly N tokens and finish_reason 'length', for N = 1 and a few more."""
    __tracebackhide__ = True
    for limit in limits:
        sampling = Sampling(max_tokens=limit, temperature=0.0, ignore_eos=True)
        gens = request(client, api, PROMPT, sampling)
        check_full_length(gens, sampling, what=f"max_tokens={limit} ({PATHS[api]})")


# ---- streaming -------------------------------------------------------------------------------------------


@dataclass
class StreamCheck:
    stream: Stream
    text: str
    tokens: int | None


def check_stream(stream: Stream, *, native: bool, max_tokens: int, what: str, chat: bool = False) -> StreamCheck:
    """Well-formed SSE: events, monotonic cumulative output (native), final usage / finish, [DONE]."""
    __tracebackhide__ = True
    if not stream.content_type.startswith("text/event-stream"):
        _fail(f"{what}: content-type {stream.content_type!r}, expected text/event-stream")
    if not stream.events:
        _fail(f"{what}: no events before the stream ended")
    if not stream.done:
        _fail(f"{what}: stream ended without 'data: [DONE]' after {len(stream.events)} events "
              f"(last line {stream.raw_lines[-1:]!r})")
    if any(b < a for a, b in zip(stream.arrival_s, stream.arrival_s[1:], strict=False)):
        _fail(f"{what}: event arrival times go backwards: {stream.arrival_s}")
    if native:
        previous: list[int] = []
        text = ""
        for index, event in enumerate(stream.events):
            ids = event.get("output_ids") or []
            if ids[: len(previous)] != previous:
                _fail(f"{what}: event {index} output_ids {ids} do not extend the previous {previous}")
            previous = ids
            text = str(event.get("text", ""))
        final = stream.events[-1]
        meta: dict[str, Any] = final.get("meta_info") or {}
        reason = meta.get("finish_reason")
        if not reason:
            _fail(f"{what}: last event has no finish_reason: {final}")
        tokens = meta.get("completion_tokens")
        if tokens != len(previous):
            _fail(f"{what}: completion_tokens {tokens} != {len(previous)} streamed ids")
        return StreamCheck(stream, text, tokens)
    usage_events = [e for e in stream.events if e.get("usage") and not e.get("choices")]
    if not usage_events:
        _fail(f"{what}: no final usage chunk (choices: [] with usage) although include_usage was requested")
    if stream.events[-1] is not usage_events[-1]:
        _fail(f"{what}: the usage chunk is not the last event: {stream.events[-1]}")
    chunks = [c for e in stream.events for c in e.get("choices") or []]
    if chat and chunks and (chunks[0].get("delta") or {}).get("role") not in ("assistant", None):
        _fail(f"{what}: first chat delta has role {(chunks[0].get('delta') or {}).get('role')!r}")
    text = "".join(str(c.get("text") or (c.get("delta") or {}).get("content") or "") for c in chunks)
    finishes = [c.get("finish_reason") for c in chunks if c.get("finish_reason")]
    if not finishes:
        _fail(f"{what}: no chunk carried a finish_reason")
    if len(finishes) != 1 or chunks[-1].get("finish_reason") != finishes[0]:
        _fail(f"{what}: finish_reason must come once, on the last choice chunk; got {finishes}")
    tokens = usage_events[-1]["usage"].get("completion_tokens")
    if not isinstance(tokens, int) or not 0 < tokens <= max_tokens:
        _fail(f"{what}: usage.completion_tokens = {tokens!r} for max_tokens={max_tokens}")
    return StreamCheck(stream, text, tokens)


def streamed(client: InferenceClient, *, native: bool, max_tokens: int = 16, api: Api | None = None) -> StreamCheck:
    """A greedy streamed generation, checked: well-formed SSE to [DONE], max_tokens tokens ('length')."""
    __tracebackhide__ = True
    flavour: Api = api or ("generate" if native else "completions")
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    stream = request_stream(client, flavour, PROMPT, sampling)
    what = f"streamed generation ({PATHS[flavour]})"
    check = check_stream(stream, native=flavour == "generate", max_tokens=max_tokens, what=what,
                         chat=flavour == "chat")
    if check.tokens != max_tokens:
        _fail(f"{what}: {check.tokens} tokens streamed with ignore_eos, expected max_tokens={max_tokens}")
    return check


# ---- stops --------------------------------------------------------------------------------------------------


def stop_string(client: InferenceClient, api: Api, *, max_tokens: int = 24) -> Generation:
    """A stop string taken from the greedy output ends generation there: finish 'stop', string not in the text."""
    __tracebackhide__ = True
    free = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    full = request(client, api, PROMPT, free)[0].text
    stop = _pick_stop_string(full)
    if stop is None:
        _fail(f"stop string ({PATHS[api]}): the greedy output {full!r} has no 2-character substring that could "
              "serve as a stop string")
    stopped = request(client, api, PROMPT, replace(free, stop=(stop,)))[0]
    where = f"stop string {stop!r} ({PATHS[api]})"
    if stopped.finish_reason != "stop":
        _fail(f"{where}: finish_reason {stopped.finish_reason!r}, expected 'stop' (greedy text {full!r}, "
              f"stopped text {stopped.text!r})")
    if stop in stopped.text:
        _fail(f"{where}: the stop string is in the returned text {stopped.text!r}")
    expected = full[: full.index(stop)]
    if stopped.text != expected:
        _fail(f"{where}: text {stopped.text!r}, expected the greedy text up to the stop string: {expected!r}")
    if stopped.matched_stop is not None and stopped.matched_stop != stop:
        _fail(f"{where}: matched_stop {stopped.matched_stop!r}")
    return stopped


def _pick_stop_string(text: str) -> str | None:
    """A short substring of `text` whose first occurrence is well inside it (printable, no replacement char)."""
    for start in range(4, max(4, len(text) - 2)):
        candidate = text[start : start + 2]
        if len(candidate) == 2 and candidate.isprintable() and "\ufffd" not in candidate and candidate.strip() \
                and text.index(candidate) == start:
            return candidate
    return None


def stop_token_id(client: InferenceClient, api: Api, *, max_tokens: int = 24) -> Generation:
    """stop_token_ids: generation ends at the first occurrence of the token (finish 'stop', matched = the id)."""
    __tracebackhide__ = True
    # No ignore_eos: SGLang checks stop_token_ids in the same branch as EOS, so ignore_eos disables them
    # (seen on the H200: with ignore_eos the stop id was generated and not honoured).
    free = Sampling(max_tokens=max_tokens, temperature=0.0)
    ids = client.generate(PROMPT, free).output_ids or []
    position = next((i for i in range(2, len(ids)) if ids[i] not in ids[:i]), None)
    if position is None:
        _fail(f"stop token id: the greedy output ids {ids} have no token that first appears after position 1")
    token = ids[position]
    stopped = request(client, api, PROMPT, replace(free, stop_token_ids=(token,)))[0]
    where = f"stop_token_ids=[{token}] ({PATHS[api]})"
    if stopped.finish_reason != "stop":
        _fail(f"{where}: finish_reason {stopped.finish_reason!r} after {stopped.completion_tokens} tokens, expected "
              f"'stop' at token {position} of the greedy ids {ids}")
    if stopped.matched_stop is not None and stopped.matched_stop != token:
        _fail(f"{where}: matched_stop {stopped.matched_stop!r}, expected {token}")
    if stopped.output_ids is not None and stopped.output_ids not in (ids[:position], ids[: position + 1]):
        _fail(f"{where}: output_ids {stopped.output_ids}, expected the greedy ids up to the stop token: "
              f"{ids[: position + 1]}")
    if stopped.completion_tokens not in (position, position + 1):
        _fail(f"{where}: {stopped.completion_tokens} tokens, expected {position + 1} (the stop token at {position})")
    return stopped


# ---- long prompts, concurrency -----------------------------------------------------------------------


@dataclass(frozen=True)
class ContextLimit:
    tokens: int
    source: str


def context_limit(client: InferenceClient, server_info: Mapping[str, Any] | None) -> ContextLimit | None:
    """The served context length: /v1/models max_model_len, else /server_info context_length."""
    try:
        response = client.request("GET", "/v1/models", timeout_s=10)
        data = response.json().get("data") if response.status_code == 200 else None
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
                fill: float = 0.9, cap_tokens: int | None = None, timeout_s: float | None = None) -> Generation:
    """A prompt of about `fill` x (context - max_tokens) tokens is answered in full ('length', prompt counted)."""
    __tracebackhide__ = True
    probe_sampling = Sampling(max_tokens=1, temperature=0.0, ignore_eos=True)
    probe_text = FILLER * 8
    flavour: Api = "completions" if api == "chat" else api  # a chat template would add tokens of its own
    probe = request(client, flavour, probe_text, probe_sampling)[0]
    if not probe.prompt_tokens:
        _fail(f"long prompt ({PATHS[flavour]}): the server reports no prompt_tokens for a {len(probe_text)}-character "
              "prompt")
    assert probe.prompt_tokens is not None
    chars_per_token = len(probe_text) / probe.prompt_tokens
    target = int((limit.tokens - max_tokens) * fill)
    if cap_tokens is not None:
        target = min(target, cap_tokens)
    text = (FILLER * (int(target * chars_per_token / len(FILLER)) + 2))[: int(target * chars_per_token)]
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    gen = request(client, flavour, text, sampling, timeout_s=timeout_s)[0]
    where = (f"long prompt of {len(text)} characters (~{target} tokens, context {limit.tokens} from {limit.source}) "
             f"({PATHS[flavour]})")
    check_full_length([gen], sampling, what=where)
    if gen.prompt_tokens is None or not 0.8 * target <= gen.prompt_tokens <= limit.tokens - max_tokens:
        _fail(f"{where}: prompt_tokens = {gen.prompt_tokens}, expected about {target}")
    return gen


def concurrent_sampled(client: InferenceClient, api: Api, *, count: int = 16, max_tokens: int = 16,
                       timeout_s: float | None = None) -> list[Generation]:
    """`count` sampled (top-k/top-p) requests with distinct seeds at once: every one completes, in full."""
    __tracebackhide__ = True
    base = Sampling(max_tokens=max_tokens, temperature=0.8, top_k=20, top_p=0.9, ignore_eos=True)

    def one(index: int) -> Generation:
        return request(client, api, f"{PROMPT} {index}", replace(base, seed=1000 + index), timeout_s=timeout_s)[0]

    results: dict[int, Generation] = {}
    errors: dict[int, DflashError] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=count, thread_name_prefix="dflash-concurrent") as pool:
        futures = {pool.submit(one, index): index for index in range(count)}
        for future in concurrent.futures.as_completed(futures):
            index = futures[future]
            try:
                results[index] = future.result()
            except DflashError as exc:
                errors[index] = exc
    if errors:
        first = min(errors)
        _fail(f"{len(errors)} of {count} concurrent sampled requests ({PATHS[api]}) failed; request {first}: "
              f"{errors[first]}")
    for index in range(count):
        check_full_length([results[index]], base, what=f"concurrent sampled request {index} of {count} "
                                                       f"({PATHS[api]})")
    return [results[index] for index in range(count)]


# ---- bad parameters ---------------------------------------------------------------------------------------

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


def bad_request_body(client: InferenceClient, api: Api, case: str, *, context_tokens: int | None) -> dict[str, Any]:
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
    shown = {k: (v if not isinstance(v, str) or len(v) < 60 else f"<{len(v)} characters>") for k, v in body.items()}
    if not 400 <= response.status_code < 500:
        _fail(f"bad request [{case}] to {path} answered HTTP {response.status_code}, expected 4xx: "
              f"{response.text[:300]!r} (request {shown})")
    if not response.text.strip():
        _fail(f"bad request [{case}] to {path}: HTTP {response.status_code} with an empty body (no error message)")
    return response.status_code


def bad_parameters(service: ServiceHandle, api: Api) -> None:
    """Every BAD_REQUESTS case of `api` gets a 4xx (all of them tried, every problem reported), then the server
    still serves a greedy request."""
    __tracebackhide__ = True
    use_api(service, api)
    limit = context_limit(service.client, service.server_info)
    problems = []
    for case, (apis, _) in BAD_REQUESTS.items():
        if api not in apis:
            continue
        try:
            bad_request(service.client, api, case, context_tokens=limit.tokens if limit else None)
        except AssertionError as exc:
            problems.append(str(exc))
    still_serving(service.client, native=service.native)
    if problems:
        _fail("\n".join(problems))


def long_prompt_near_context(service: ServiceHandle, api: Api, *, cap_tokens: int | None) -> None:
    """long_prompt at ~90% of the context the server reports; skipped when it reports none."""
    __tracebackhide__ = True
    use_api(service, api)
    limit = context_limit(service.client, service.server_info)
    if limit is None:
        pytest.skip("the server reports no context length (/v1/models max_model_len, /server_info context_length)")
    long_prompt(service.client, api, limit, cap_tokens=cap_tokens)


def still_serving(client: InferenceClient, *, native: bool, timeout_s: float = 30.0) -> None:
    """After an abusive test: the server still answers a small greedy request (dead or wedged fails here)."""
    __tracebackhide__ = True
    sampling = Sampling(max_tokens=4, temperature=0.0, ignore_eos=True)
    try:
        gen = _generate(client, PROMPT, sampling, native=native, timeout_s=timeout_s)
    except ApiError as exc:
        _fail(f"the server stopped serving after this test: a 4-token greedy request failed: {exc}")
    check_completion_shape(gen, sampling, what="greedy request after the test")


# ---- what is served -------------------------------------------------------------------------------------


def served_algorithm_unknown(service: ServiceHandle) -> str | None:
    """Why the served algorithm cannot be compared with the profile's (skip reason), or None."""
    if service.spec.discovery_error is not None:
        return None  # check_served_algorithm fails with it
    if not service.native:
        return "needs SGLang's /server_info (not an SGLang server)"
    if service.spec.algorithm == AUTO:
        return "the attached server's algorithm was not read before the tests were selected (no profile algorithm)"
    return None


def check_served_algorithm(service: ServiceHandle) -> None:
    """The server runs the profile's speculative algorithm (/server_info speculative_algorithm; none = NONE).

    A DFLASH unit that serves plain decoding passes every generation check and is only slower: this is the one
    check that sees it.
    """
    __tracebackhide__ = True
    if service.spec.discovery_error is not None:
        _fail(f"{service.label}: {service.spec.discovery_error}")
    served = str((service.server_info or {}).get("speculative_algorithm") or "NONE").upper()
    if served != service.spec.algorithm:
        _fail(f"{service.label}: the profile says {service.spec.algorithm}, the server runs {served} "
              "(server_info speculative_algorithm); check the unit's --speculative-algorithm")


# ---- greedy fallback ------------------------------------------------------------------------------------


@dataclass
class SeedVariation:
    """Outputs of one prompt at temperature 1 with different seeds."""

    seeds: list[int]
    texts: list[str]
    ids: list[tuple[int, ...]] | None  # native only

    @property
    def outputs(self) -> list[tuple[int, ...]] | list[str]:
        return self.ids if self.ids is not None else self.texts

    @property
    def distinct(self) -> int:
        return len(set(self.outputs))

    def identical_pairs(self) -> int:
        """Pairs of samples (different seeds) that are identical throughout."""
        counts: dict[object, int] = {}
        for output in self.outputs:
            counts[output] = counts.get(output, 0) + 1
        return sum(n * (n - 1) // 2 for n in counts.values())

    def same_first_token_pairs(self) -> tuple[int, int]:
        """Native only: (pairs of samples sharing their first token, how many of those are identical throughout)."""
        if self.ids is None:
            return 0, 0
        groups: dict[int, list[tuple[int, ...]]] = {}
        for ids in self.ids:
            if ids:
                groups.setdefault(ids[0], []).append(ids)
        pairs = identical = 0
        for members in groups.values():
            for i in range(len(members)):
                for j in range(i + 1, len(members)):
                    pairs += 1
                    identical += members[i] == members[j]
        return pairs, identical


def sample_seeds(client: InferenceClient, api: Api, *, count: int | None = None, max_tokens: int = 24,
                 base_seed: int = 500, timeout_s: float | None = None) -> SeedVariation:
    """Samples of SEED_PROMPT at temperature 1, each with its own seed.

    Natively 32 in one batched request (token ids); otherwise 16 concurrent requests (text only).
    """
    count = count or (32 if api == "generate" else 16)
    seeds = [base_seed + i for i in range(count)]
    sampling = Sampling(max_tokens=max_tokens, temperature=1.0, ignore_eos=True)
    if api == "generate":
        batch = generate_batch(client, [SEED_PROMPT] * count, [replace(sampling, seed=s) for s in seeds],
                               timeout_s=timeout_s)
        return SeedVariation(seeds, [g.text for g in batch], [tuple(g.output_ids or ()) for g in batch])

    def one(seed: int) -> str:
        return request(client, api, SEED_PROMPT, replace(sampling, seed=seed), timeout_s=timeout_s)[0].text

    with concurrent.futures.ThreadPoolExecutor(max_workers=count, thread_name_prefix="dflash-seeds") as pool:
        texts = list(pool.map(one, seeds))
    return SeedVariation(seeds, texts, None)


def generate_batch(client: InferenceClient, prompts: Sequence[str], samplings: Sequence[Sampling], *,
                   timeout_s: float | None = None) -> list[Generation]:
    """One native /generate request carrying a batch: prompt i with sampling i (SGLang's list form)."""
    if len(prompts) != len(samplings):
        raise ValueError("one sampling per prompt")
    body = {"text": list(prompts), "sampling_params": [s.as_sglang() for s in samplings]}
    response = client.request("POST", "/generate", json_body=body, timeout_s=timeout_s)
    if response.status_code >= 400:
        raise ApiError(client.service, "/generate", response.status_code, "batch request refused", response.text[:500])
    try:
        data = response.json()
    except ValueError as exc:
        raise ApiError(client.service, "/generate", response.status_code, f"malformed JSON body: {exc}",
                       response.text[:500]) from exc
    if not isinstance(data, list) or len(data) != len(prompts):
        raise ApiError(client.service, "/generate", response.status_code,
                       f"a batch of {len(prompts)} got {len(data) if isinstance(data, list) else 'no'} results",
                       response.text[:300])
    out = []
    for item in data:
        ids = item.get("output_ids") if isinstance(item, dict) else None
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not isinstance(ids, list) or not isinstance(meta, dict):
            raise ApiError(client.service, "/generate", response.status_code, "batch result lacks output_ids/meta_info",
                           str(item)[:300])
        reason = meta.get("finish_reason")
        out.append(Generation(text=str(item.get("text", "")), output_ids=[int(i) for i in ids],
                              finish_reason=reason.get("type") if isinstance(reason, dict) else reason,
                              completion_tokens=meta.get("completion_tokens"), prompt_tokens=meta.get("prompt_tokens"),
                              meta=meta))
    return out


def service_log_line(handle: ServiceHandle, pattern: re.Pattern[str], *, lines: int = 20000) -> str | None:
    """The first line of the service's log (since this run started it, or its recent journal) matching pattern."""
    try:
        log = handle.manager.logs_since(handle.started_mark, lines)
    except DflashError:
        return None
    match = pattern.search(log)
    return match.group(0).strip() if match else None


def check_seed_variation(variation: SeedVariation, *, api: Api, log_line: Callable[[], str | None]) -> None:
    """Fail when seeds do not change the output (greedy fallback), naming SGLang's log line when present.

    Failing patterns: all samples identical; (native) at least 3 pairs of samples share their first token
    and every such pair is identical after it; (text only) at least 3 pairs of samples are identical
    throughout. A correctly sampled 24-token run of random numbers practically never repeats.
    """
    __tracebackhide__ = True
    count = len(variation.seeds)
    where = f"temperature 1, seeds {variation.seeds[0]}..{variation.seeds[-1]}, {PATHS[api]}"
    problem = None
    if variation.distinct == 1:
        problem = f"all {count} samples ({where}) are identical: {variation.texts[0][:60]!r}"
    elif variation.ids is not None:
        pairs, identical = variation.same_first_token_pairs()
        if pairs >= 3 and identical == pairs:
            problem = (f"{pairs} pairs of samples ({where}) share their first token and every such pair is identical "
                       f"after it ({variation.distinct} distinct outputs of {count}): only the first token is "
                       "sampled, every later token is the greedy continuation")
    elif (identical := variation.identical_pairs()) >= 3:
        problem = (f"{identical} pairs of samples ({where}) are identical throughout ({variation.distinct} distinct "
                   f"outputs of {count}): later tokens are not sampled")
    if problem is None:
        return
    line = log_line()
    if line:
        _fail(f"greedy fallback: {problem}.\nThe server log says: {line}")
    _fail(f"sampling is not sampling: {problem}. SGLang's greedy-fallback warning is not in the service log (it may "
          "have left the journal); check the speculative verifier's sampling path")


__all__ = [
    "APIS",
    "BAD_REQUESTS",
    "GREEDY",
    "PATHS",
    "SAMPLED",
    "SAMPLING_CASES",
    "Api",
    "ContextLimit",
    "SeedVariation",
    "StreamCheck",
    "bad_parameters",
    "bad_request",
    "check_completion_shape",
    "check_full_length",
    "check_seed_variation",
    "check_served_algorithm",
    "check_stream",
    "concurrent_sampled",
    "context_limit",
    "default_api",
    "generate_batch",
    "greedy",
    "long_prompt",
    "long_prompt_near_context",
    "max_tokens_boundary",
    "n_samples",
    "request",
    "request_stream",
    "require_api",
    "sample_seeds",
    "sampled",
    "sampled_case",
    "sampling_varies_with_seed",
    "served_algorithm_unknown",
    "service_log_line",
    "still_serving",
    "stop_string",
    "stop_token_id",
    "streamed",
    "use_api",
]


def sampling_varies_with_seed(service: ServiceHandle, api: Api | None = None) -> SeedVariation:
    """Greedy-fallback detection on `service`: SEED_PROMPT sampled with different seeds must vary beyond token 1.

    One batched native request of 32 samples (else 16 concurrent completions): cheap enough for the smoke suite.
    On a failure, SGLang's greedy-fallback warning is quoted from the service log when it is there.
    """
    __tracebackhide__ = True
    flavour: Api = api or ("generate" if service.native else "completions")
    variation = sample_seeds(service.client, flavour)
    check_seed_variation(variation, api=flavour, log_line=lambda: service_log_line(service, GREEDY_FALLBACK_LINE))
    return variation
