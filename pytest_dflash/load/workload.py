"""Request building: request *i* of a :class:`~pytest_dflash.load.spec.LoadSpec` → prompt, lengths
and body bytes, deterministic for a seed and independent of scheduling: synthetic words (the default, for
throughput-only runs), or a prompt dataset — JSONL, ShareGPT, or the set shipped in
pytest_dflash/data/prompts.jsonl (``builtin``), shuffled by the seed and cycled."""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_dflash.documents import loads_json
from pytest_dflash.errors import DocumentTooDeep
from pytest_dflash.load.spec import LoadSpec, as_dist

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


SHIPPED_DATASET = Path(__file__).resolve().parents[1] / "data" / "prompts.jsonl"
# `dataset = "builtin"` / `--dataset builtin`: the prompt set shipped with the plugin
BUILTIN_NAME = "builtin"


class DatasetError(ValueError):
    """A prompt dataset that cannot be used: one line naming the file (and the line or item)."""


@dataclass(frozen=True, slots=True)
class DatasetPrompt:
    """One prompt of a dataset: its text, its category (None: uncategorised) and its own output length."""

    prompt: str
    category: str | None = None
    output_len: int | None = None


@dataclass(frozen=True, slots=True)
class _Item:
    prompt: str
    prompt_len: int
    max_tokens: int
    category: str | None = None


def dataset_path(path: str | Path) -> Path:
    """``builtin`` is the shipped prompt set; anything else a path."""
    return SHIPPED_DATASET if str(path) == BUILTIN_NAME else Path(path)


def _first_human_turn(where: str, conversations: Any) -> str | None:
    if not isinstance(conversations, list):
        raise DatasetError(f'{where}: "conversations" is not a list')
    for turn in conversations:
        if not isinstance(turn, dict):
            raise DatasetError(f"{where}: a conversation turn is not an object")
        if turn.get("from") in ("human", "user") and isinstance(turn.get("value"), str):
            return str(turn["value"])
    return None


def dataset_entry(where: str, obj: Any) -> DatasetPrompt | None:
    """One JSONL line or one list item: {"prompt", "category"?, "output_len"?} or ShareGPT
    {"conversations"}."""
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "prompt" in obj:
        prompt, category, out = obj["prompt"], obj.get("category"), obj.get("output_len")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(f'{where}: "prompt" is not a non-empty string')
        if category is not None and (not isinstance(category, str) or not category):
            raise DatasetError(f'{where}: "category" is not a non-empty string')
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise DatasetError(f'{where}: "output_len" is not a positive integer')
        return DatasetPrompt(prompt, category, out)
    # ShareGPT: the first human turn is the prompt (entries without one are skipped)
    if "conversations" in obj:
        text = _first_human_turn(where, obj["conversations"])
        return DatasetPrompt(text) if text and text.strip() else None
    raise DatasetError(f'{where}: unknown format: expected {{"prompt": ...}} (JSONL) or ShareGPT\'s '
                       f'{{"conversations": [{{"from": "human", "value": ...}}]}}, '
                       f'got keys {sorted(obj)[:6]}')


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, _mtime_ns: int, _size: int) -> tuple[DatasetPrompt, ...]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read the dataset: {exc.strerror or exc}") from None
    items: list[DatasetPrompt] = []
    if text.lstrip().startswith("["):  # one JSON list: ShareGPT (or a list of {"prompt"} objects)
        try:
            data = loads_json(text)
        except DocumentTooDeep as exc:
            raise DatasetError(f"{path}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        for index, obj in enumerate(data):
            entry = dataset_entry(f"{path}: item {index}", obj)
            if entry is not None:
                items.append(entry)
    else:  # JSONL: one object per line
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = loads_json(line)
            except DocumentTooDeep as exc:
                raise DatasetError(f"{path}:{lineno}: {exc}") from None
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from None
            entry = dataset_entry(f"{path}:{lineno}", obj)
            if entry is not None:
                items.append(entry)
    if not items:
        raise DatasetError(f"{path}: no prompts in the dataset")
    return tuple(items)


def load_dataset(path: str | Path) -> list[DatasetPrompt]:
    """A prompt dataset: JSONL of {"prompt", "category"?, "output_len"?} (or ShareGPT objects) per line, or
    ShareGPT's JSON list of {"conversations": [{"from": "human", "value": ...}, ...]} (the first human turn is
    the prompt).

    ``builtin`` is the shipped set (SHIPPED_DATASET). Raises DatasetError, one line naming the file and
    line/item.
    """
    resolved = dataset_path(path)
    try:
        st = resolved.stat()
    except OSError as exc:
        raise DatasetError(f"{resolved}: cannot read the dataset: {exc.strerror or exc}") from None
    if not resolved.is_file():
        raise DatasetError(f"{resolved}: not a file")
    return list(_load_cached(str(resolved), st.st_mtime_ns, st.st_size))


def sample_by_category(prompts: Sequence[DatasetPrompt], total: int, *, seed: int = 0) -> list[DatasetPrompt]:
    """A seeded sample of at most `total` prompts spread evenly over the categories (sorted; the first ones
    get the remainder), in category order. Uncategorised prompts count as one category, "uncategorised"."""
    groups: dict[str, list[DatasetPrompt]] = {}
    for p in prompts:
        groups.setdefault(p.category or "uncategorised", []).append(p)
    names = sorted(groups)
    if not names or total < 1:
        return []
    share, extra = divmod(total, len(names))
    rng = random.Random(seed)
    out: list[DatasetPrompt] = []
    for k, name in enumerate(names):
        members = groups[name]
        want = min(share + (1 if k < extra else 0), len(members))
        out += rng.sample(members, want)
    return out


class Workload:
    """Deterministic request i -> (prompt, lengths, body bytes), independent of scheduling."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.prompt_dist = as_dist(spec.prompt_len)
        self.output_dist = as_dist(spec.output_len)
        self.dataset = load_dataset(spec.dataset) if spec.dataset else None
        if self.dataset is not None:
            order = list(range(len(self.dataset)))
            random.Random(spec.seed).shuffle(order)
            self.order = order

    def item(self, i: int) -> _Item:
        rng = random.Random(self.spec.seed * 1_000_003 + i)
        if self.dataset is not None:
            entry = self.dataset[self.order[i % len(self.order)]]
            out = entry.output_len if entry.output_len is not None else self.output_dist.sample(rng)
            return _Item(entry.prompt, len(entry.prompt.split()), out, entry.category)
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
