"""--parity-prompts / [parity] prompts read the load generator's dataset formats (JSONL, ShareGPT) too, and the accept
length is measured on a small seeded sample of the shipped prompt set, one number per category."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from pytest_dflash.layers.parity.acceptance import Acceptance
from pytest_dflash.layers.parity.checks import ACCEPTANCE_SAMPLE, acceptance_prompts
from pytest_dflash.layers.parity.prompts import load_prompts


def test_jsonl_and_sharegpt_prompt_files(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"category": "math", "prompt": "What is 2 + 2?"}\n\n{"prompt": "Say hi."}\n')
    assert [(p.name, p.text, p.category) for p in load_prompts(jsonl)] == [
        ("p:math:0", "What is 2 + 2?", "math"), ("p:1", "Say hi.", None)]
    sharegpt = tmp_path / "s.json"
    sharegpt.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "first question"}, {"from": "gpt", "value": "answer"}]},
        {"conversations": [{"from": "gpt", "value": "no human turn"}]},
        {"category": "code", "prompt": "def f():"},
        "a plain string",
    ]))
    assert [(p.text, p.category) for p in load_prompts(sharegpt)] == [
        ("first question", None), ("def f():", "code"), ("a plain string", None)]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": \n', r"bad.jsonl:2: not valid JSON"),
    ("bad.jsonl", '{"question": "x"}\n', r"bad.jsonl:1: unknown format"),
    ("bad.json", '[{"conversations": 3}]', r"bad.json: item 0: \"conversations\" is not a list"),
    ("bad.json", '[\n"a",\n', r"bad.json:3: not valid JSON"),
    ("empty.jsonl", "\n", r"empty.jsonl: no prompts in the dataset"),
    ("deep.json", "[" * 20_000, r"deep.json: JSON nested too deep"),
    ("deep.jsonl", "{\"a\": " * 20_000, r"deep.jsonl:1: JSON nested too deep"),
])
def test_a_bad_prompt_file_is_one_line_naming_file_and_line(tmp_path: Path, name: str, content: str,
                                                            message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        load_prompts(path)
    assert "\n" not in str(info.value)


def test_parity_prompts_option_takes_a_jsonl_dataset(pytester: pytest.Pytester, tmp_path: Path) -> None:
    from pytest_dflash.layers.parity.hooks import OPTIONS_KEY

    path = tmp_path / "extra.jsonl"
    path.write_text('{"category": "code", "prompt": "import os"}\n')
    options = pytester.parseconfigure("--parity-prompts", str(path)).stash[OPTIONS_KEY]
    assert [(p.text, p.category) for p in options.extra_prompts] == [("import os", "code")]
    path.write_text('{"category": "code", "prompt": "import os"}\n{"nope": 1}\n')
    with pytest.raises(pytest.UsageError, match=r"--parity-prompts / dflash_parity_prompts: .*extra.jsonl:2: unknown"):
        pytester.parseconfigure("--parity-prompts", str(path))


def test_the_acceptance_sample_is_small_and_covers_every_category() -> None:
    sample = acceptance_prompts()
    assert len(sample) == ACCEPTANCE_SAMPLE <= 20 and sample == acceptance_prompts()
    counts = collections.Counter(p.category for p in sample)
    assert set(counts) == {"chat", "code", "math", "summarisation", "multilingual"} and min(counts.values()) >= 3


def test_per_category_accept_length_is_token_weighted() -> None:
    result = Acceptance("dflash", "meta_info", 3, by_category={"code": [30, 10, 2], "chat": [8, 4, 1]})
    assert result.per_category == {"chat": 2.0, "code": 3.0}
    assert result.describe_categories() == "chat 2.00, code 3.00"
    fact = result.as_fact()
    assert fact["per_category"] == {"chat": 2.0, "code": 3.0} and fact["prompts_per_category"] == {"chat": 1, "code": 2}
    assert "per_category" not in Acceptance("dflash", "server_info", 3).as_fact()
