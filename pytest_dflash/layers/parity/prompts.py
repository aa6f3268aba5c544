"""The prompts the parity layer compares outputs on: the built-in set, and prompt files (.jsonl,
.json, text)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pytest_dflash.documents import loads_json
from pytest_dflash.errors import DocumentTooDeep
from pytest_dflash.load.workload import dataset_entry, load_dataset


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    category: str | None = None  # from a dataset's "category" (accept length is reported per category)


_LONG = (
    "Speculative decoding speeds up autoregressive generation without changing its output. A small draft "
    "model proposes several tokens ahead, and the large target model checks all of them in a single forward "
    "pass. Every proposed token that matches what the target model would have produced is kept, and the "
    "first mismatch is replaced by the target's own choice, so each verification step yields at least one "
    "token and often many more. Block diffusion drafters such as DFlash propose a whole block of tokens in "
    "one pass, conditioned on hidden states taken from the target model, while tree drafters such as DDTree "
    "propose several alternative continuations at once and verify the whole tree with an attention mask "
    "that lets every node see only its ancestors. Because verification always defers to the target model, "
    "greedy decoding with speculation must produce exactly the same tokens as greedy decoding without it, "
    "and sampling must draw from exactly the same distribution. The rest of this report describes how we "
    "checked that claim on our servers, and what we found when we"
)

BUILTIN_PROMPTS: tuple[Prompt, ...] = (
    Prompt("short", "The quick brown fox"),
    Prompt("question", "Q: What is the boiling point of water at sea level?\nA:"),
    Prompt("long", _LONG),
    Prompt("code", 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'),
    Prompt("code-c", "#include <stdio.h>\n\nint main(void) {\n    for (int i = 0; i < 10; i++) {\n"),
    Prompt("repetitive", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"),
    Prompt("repetitive-words", "red green blue red green blue red green blue red"),
)


def load_prompts(path: Path) -> list[Prompt]:
    """Prompts from a file: ``.jsonl`` is a dataset as the perf layer reads it (one {"prompt"} / {"category",
    "prompt"} / ShareGPT {"conversations"} object per line); ``.json`` a list of strings, of {"name", "text"},
    of {"prompt", "category"?} or ShareGPT's {"conversations": [{"from": "human", "value"}, ...]} (the first
    human turn); any other file one prompt per non-empty line ('#' starts a comment line).

    Raises ValueError naming the file and what is wrong (and the line or item).
    """
    if path.suffix == ".jsonl":
        entries = load_dataset(path)
        return [Prompt(f"{path.stem}:{e.category + ':' if e.category else ''}{index}", e.prompt, e.category)
                for index, e in enumerate(entries)]
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the prompts file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if path.suffix == ".json":
        try:
            data = loads_json(raw)
        except DocumentTooDeep as exc:
            raise ValueError(f"{path}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of prompts")
        prompts = []
        for index, item in enumerate(data):
            if isinstance(item, str):
                prompts.append(Prompt(f"{path.stem}[{index}]", item))
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                prompts.append(Prompt(str(item.get("name") or f"{path.stem}[{index}]"), item["text"]))
            elif isinstance(item, dict) and ("prompt" in item or "conversations" in item):
                entry = dataset_entry(f"{path}: item {index}", item)
                if entry is not None:  # a ShareGPT conversation without a human turn is skipped
                    prompts.append(Prompt(f"{path.stem}[{index}]", entry.prompt, entry.category))
            else:
                raise ValueError(f"{path}: item {index}: expected a string, {{\"name\", \"text\"}}, "
                                 f"{{\"prompt\"}} or ShareGPT's {{\"conversations\"}}")
    else:
        lines = [line for line in raw.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        prompts = [Prompt(f"{path.stem}:{number}", line) for number, line in enumerate(lines, 1)]
    if not prompts:
        raise ValueError(f"{path}: no prompts in the file")
    if any(not p.text for p in prompts):
        raise ValueError(f"{path}: empty prompt")
    return prompts


__all__ = ["BUILTIN_PROMPTS", "Prompt", "load_prompts"]
