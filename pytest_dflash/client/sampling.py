"""What a call sends (`Sampling`, rendered for either dialect; `GREEDY`, `SAMPLED`) and what it gets back
(`Generation`, the sampler checks' view of a typed `Answer`; `Stream`, a completed SSE stream)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_dflash.client.answers import Answer


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
        for key, value in (("top_p", self.top_p), ("top_k", self.top_k), ("min_p", self.min_p),
                           ("seed", self.seed)):
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


@dataclass(frozen=True)
class Generation:
    """One completed generation as the sampler checks read it: a view of the client's typed `Answer` (the one
    reading of an answer body, client/answers.py) and the time the call took. Nothing here reads JSON."""

    answer: Answer
    elapsed_s: float = 0.0

    @property
    def text(self) -> str:
        """The content (chat under a reasoning parser: after the reasoning), else the text."""
        return self.answer.content

    @property
    def reasoning(self) -> str | None:
        return self.answer.reasoning

    @property
    def finish_reason(self) -> str | None:
        return self.answer.finish_reason

    @property
    def matched_stop(self) -> object:
        return self.answer.matched_stop

    @property
    def output_ids(self) -> list[int] | None:
        ids = self.answer.output_ids
        return None if ids is None else [int(i) for i in ids]

    @property
    def prompt_tokens(self) -> int | None:
        return self.answer.prompt_tokens

    @property
    def completion_tokens(self) -> int | None:
        return self.answer.completion_tokens

    @property
    def index(self) -> int | None:
        """The OpenAI choice's index (None for /generate)."""
        return self.answer.index

    @property
    def meta(self) -> Mapping[str, Any]:
        """The native answer's meta_info ({} for OpenAI: its usage is `usage`)."""
        return self.answer.meta_info

    @property
    def usage(self) -> Mapping[str, Any]:
        return self.answer.usage

    @property
    def logprobs(self) -> list[tuple[float, int]] | None:
        entries = self.answer.logprobs
        return None if entries is None else [(e.logprob, e.token) for e in entries]

    @property
    def top_logprobs(self) -> list[list[tuple[float, int]]] | None:
        steps = self.answer.top_logprobs
        return None if steps is None else [[(e.logprob, e.token) for e in step] for step in steps]

    @property
    def output(self) -> str:
        """Everything the sampler produced, reasoning first (chat under a reasoning parser splits it)."""
        return self.answer.output

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
    error: dict[str, Any] | None = None  # an error event inside the stream (read with in_band_errors)


