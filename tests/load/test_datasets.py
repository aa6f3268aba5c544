"""Prompt datasets for the load generator: the shipped set, JSONL and ShareGPT files, what a run really sends (the
synthetic server's GET /prompts), and the one-line errors of a bad file (library and `python -m pytest_dflash.load`)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.load import LoadSpec, run_load
from pytest_dflash.load.workload import (
    SHIPPED_DATASET,
    DatasetError,
    Workload,
    load_dataset,
    sample_by_category,
)

CATEGORIES = {"chat", "code", "math", "summarisation", "multilingual"}


def _received(srv: Any) -> list[str]:  # conftest.Synth
    data = srv.get("/prompts")
    assert data["recorded"] is True
    prompts: list[str] = data["prompts"]
    return prompts


def test_the_shipped_set_parses_and_covers_every_category() -> None:
    lines = SHIPPED_DATASET.read_text(encoding="utf-8").splitlines()
    raw = [json.loads(line) for line in lines]
    assert all(set(obj) == {"category", "prompt"} for obj in raw)
    prompts = load_dataset("builtin")
    assert len(prompts) == len(raw) >= 300
    counts = collections.Counter(p.category for p in prompts)
    assert set(counts) == CATEGORIES and min(counts.values()) >= 50, counts
    assert len({p.prompt for p in prompts}) == len(prompts)  # no duplicates
    assert all(10 <= len(p.prompt) <= 600 for p in prompts)  # short to medium requests


def test_the_seeded_category_sample_is_small_even_and_stable() -> None:
    prompts = load_dataset(SHIPPED_DATASET)
    sample = sample_by_category(prompts, 16, seed=0)
    assert len(sample) == 16 and sample == sample_by_category(prompts, 16, seed=0)
    counts = collections.Counter(p.category for p in sample)
    assert set(counts) == CATEGORIES and sorted(counts.values()) == [3, 3, 3, 3, 4]
    assert sample != sample_by_category(prompts, 16, seed=1)


def test_a_dataset_run_sends_exactly_the_datasets_prompts_in_a_seeded_order(synth, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    texts = [f"prompt number {k}: tell me about the colour {c}" for k, c in enumerate(["red", "green", "blue",
                                                                                        "amber", "violet"])]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"category": "chat" if k % 2 else "code", "prompt": t}) + "\n"
                            for k, t in enumerate(texts)) + "\n")
    orders = []
    for seed in (3, 3, 4):
        srv = synth("--tokens", "4", "--ttft-ms", "1", "--itl-ms", "0", "--record-prompts")
        spec = LoadSpec(num_requests=10, concurrency=1, dataset=str(path), seed=seed, output_len=4)
        result = run_load(srv.url, spec, progress=False)
        assert result.metrics["completed"] == 10
        received = _received(srv)
        assert collections.Counter(received) == {t: 2 for t in texts}  # cycled: each prompt twice, nothing else
        assert received[:5] == received[5:]  # one seeded permutation, repeated
        orders.append(received)
        workload = Workload(spec)
        assert [workload.item(i).prompt for i in range(10)] == received  # request i is the i-th sent (concurrency 1)
        assert {workload.item(i).category for i in range(10)} == {"chat", "code"}
    assert orders[0] == orders[1] and orders[0] != orders[2]


def test_sharegpt_takes_the_first_human_turn(synth, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "How do tides work?"},
                                      {"from": "gpt", "value": "The moon's gravity ..."},
                                      {"from": "human", "value": "and the sun?"}]},
        {"id": "b", "conversations": [{"from": "system", "value": "be brief"},
                                      {"from": "human", "value": "Name three rivers."}]},
        {"id": "c", "conversations": [{"from": "gpt", "value": "no human turn: skipped"}]},
        {"id": "d", "conversations": []},
    ], indent=1))
    assert [p.prompt for p in load_dataset(path)] == ["How do tides work?", "Name three rivers."]
    srv = synth("--tokens", "4", "--ttft-ms", "1", "--itl-ms", "0", "--record-prompts")
    run_load(srv.url, LoadSpec(endpoint="completions", num_requests=4, dataset=str(path)), progress=False)
    assert collections.Counter(_received(srv)) == {"How do tides work?": 2, "Name three rivers.": 2}


def test_the_synthetic_load_stays_the_default(synth) -> None:  # type: ignore[no-untyped-def]
    srv = synth("--tokens", "4", "--ttft-ms", "1", "--itl-ms", "0", "--record-prompts")
    run_load(srv.url, LoadSpec(num_requests=3, prompt_len=8), progress=False)
    received = _received(srv)
    assert [p.split()[0] for p in received] == ["0", "1", "2"] and all(len(p.split()) == 8 for p in received)


@pytest.mark.parametrize(("content", "where", "what"), [
    (None, "", "cannot read the dataset: No such file or directory"),
    ('{"prompt": "fine"}\n{"prompt": "broken"\n', ":2", "not valid JSON"),
    ("\n\n", "", "no prompts in the dataset"),
    ('{"prompt": "fine"}\n{"question": "what?"}\n', ":2", "unknown format: expected"),
    ('{"prompt": ""}\n', ":1", '"prompt" is not a non-empty string'),
    ('{"prompt": "x", "output_len": 0}\n', ":1", '"output_len" is not a positive integer'),
    ('[{"conversations": [{"from": "human", "value": "a"}]},\n {"conversations": [}]\n', ":2", "not valid JSON"),
    ('[{"conversations": "not a list"}]', ": item 0", '"conversations" is not a list'),
    ("[]", "", "no prompts in the dataset"),
    ('{"prompt": "fine"}\n' + "[" * 20_000 + "\n", ":2", "JSON nested too deep"),
    ("[" * 20_000, "", "JSON nested too deep"),
], ids=["missing", "bad-json-line", "empty", "unknown-format", "empty-prompt", "output-len", "bad-json-list",
        "sharegpt-shape", "empty-list", "deep-line", "deep-list"])
def test_a_bad_dataset_is_one_line_naming_the_file_and_line(tmp_path: Path, content: str | None, where: str,
                                                            what: str) -> None:
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    message = str(info.value)
    assert message.startswith(f"{path}{where}: ") and what in message and "\n" not in message, message


def test_the_cli_sends_a_dataset_and_refuses_a_bad_one_in_one_line(synth, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = synth("--tokens", "4", "--ttft-ms", "1", "--itl-ms", "0", "--record-prompts")
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "pytest_dflash.load", srv.url, "--num-requests", "6",
                           "--concurrency", "2", "--output-len", "4", "--dataset", "builtin", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shipped = {p.prompt for p in load_dataset("builtin")}
    received = _received(srv)
    assert len(received) == 6 and set(received) <= shipped and len(set(received)) == 6
    assert json.loads(out.read_text())["spec"]["dataset"] == str(SHIPPED_DATASET)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    done = subprocess.run([sys.executable, "-m", "pytest_dflash.load", srv.url, "--num-requests", "1",
                           "--dataset", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"python -m pytest_dflash.load: error: --dataset: {bad}:2: not valid "
                                                "JSON: Expecting value"], done.stderr
