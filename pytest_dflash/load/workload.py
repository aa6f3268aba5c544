"""Request building: request *i* of a :class:`~pytest_dflash.load.spec.LoadSpec` → prompt, lengths
and body bytes, deterministic for a seed and independent of scheduling (synthetic words or a JSONL
dataset)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from pytest_dflash.load.spec import LoadSpec, _as_dist

_WORDS_TEXT = (
    "the of and to in is was for on that with as by at from his it an were are which this be or has "
    "had one their not but new after first two her its been they who also other year time can more "
    "city world into when most over some between many people state only three known where group "
    "during team used school while being under during part made game such later film series found "
    "name government since house early high system until well same each work both around album three "
    "north south west east season river club line family local second music public small great long "
    "best life power early market light water field story order point model stone "
)
_WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class _Item:
    prompt: str
    prompt_len: int
    max_tokens: int


def _load_dataset(path: str) -> list[tuple[str, int | None]]:
    items: list[tuple[str, int | None]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                prompt = obj["prompt"]
                if not isinstance(prompt, str):
                    raise TypeError("prompt is not a string")
                out = obj.get("output_len")
                if out is not None and (not isinstance(out, int) or out < 1):
                    raise TypeError("output_len is not a positive integer")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            items.append((prompt, out))
    if not items:
        raise ValueError(f"{path}: no prompts")
    return items


class _Workload:
    """Deterministic request i -> (prompt, lengths, body bytes), independent of scheduling."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.prompt_dist = _as_dist(spec.prompt_len)
        self.output_dist = _as_dist(spec.output_len)
        self.dataset = _load_dataset(spec.dataset) if spec.dataset else None
        if self.dataset is not None:
            order = list(range(len(self.dataset)))
            random.Random(spec.seed).shuffle(order)
            self.order = order

    def item(self, i: int) -> _Item:
        rng = random.Random(self.spec.seed * 1_000_003 + i)
        if self.dataset is not None:
            prompt, out = self.dataset[self.order[i % len(self.order)]]
            return _Item(prompt, len(prompt.split()), out if out is not None else self.output_dist.sample(rng))
        n = self.prompt_dist.sample(rng)
        out_len = self.output_dist.sample(rng)
        words = [str(i)] + [rng.choice(_WORDS) for _ in range(max(n - 1, 0))]
        return _Item(" ".join(words), n, out_len)

    def body(self, item: _Item) -> bytes:
        s = self.spec
        if s.endpoint == "generate":
            sp: dict[str, Any] = {"max_new_tokens": item.max_tokens, "temperature": s.temperature,
                                  "ignore_eos": s.ignore_eos}
            if s.top_p is not None:
                sp["top_p"] = s.top_p
            if s.top_k is not None:
                sp["top_k"] = s.top_k
            obj: dict[str, Any] = {"text": item.prompt, "sampling_params": sp, "stream": True}
        else:
            obj = {"model": s.model, "max_tokens": item.max_tokens, "temperature": s.temperature,
                   "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": s.ignore_eos}
            if s.top_p is not None:
                obj["top_p"] = s.top_p
            if s.top_k is not None:
                obj["top_k"] = s.top_k
            if s.endpoint == "chat":
                obj["messages"] = [{"role": "user", "content": item.prompt}]
            else:
                obj["prompt"] = item.prompt
        return json.dumps(obj, separators=(",", ":")).encode()
