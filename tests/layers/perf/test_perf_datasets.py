"""[perf] dataset / --perf-dataset: validated at load (one-line errors naming the file and line), resolved with the
command line into the load spec, and the per-request accept lengths of a real run grouped per category."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.errors import InventoryError
from pytest_dflash.layers.perf.hooks import OPTIONS_KEY
from pytest_dflash.layers.perf.report import summary_lines
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfOverrides, PerfSettings
from pytest_dflash.load.workload import SHIPPED_DATASET

BASE = """
[host]
connection = "ssh://root@10.1.2.200"

[services.dflash]
unit = "dflash.service"
algorithm = "DFLASH"
port = 30001
"""


def _profile(tmp_path: Path, perf: str) -> Path:
    path = tmp_path / "gpu.toml"
    path.write_text(BASE + "\n[perf]\n" + perf)
    return path


def test_a_profile_dataset_is_relative_to_the_profile_and_builtin_is_the_shipped_set(tmp_path: Path) -> None:
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "p.jsonl").write_text('{"category": "code", "prompt": "def f():"}\n')
    profile = load_profile(_profile(tmp_path, 'dataset = "sets/p.jsonl"\n'))
    assert profile.perf["dataset"] == str((tmp_path / "sets" / "p.jsonl").resolve())
    settings = PerfSettings.resolve(profile.perf, "dflash")
    assert settings.dataset == profile.perf["dataset"]
    spec = settings.load_spec(native=True, speculative=True)
    assert spec.dataset == profile.perf["dataset"]
    assert "prompts of p.jsonl" in settings.describe(True)
    assert load_profile(_profile(tmp_path, 'dataset = "builtin"\n')).perf["dataset"] == str(SHIPPED_DATASET)
    override = PerfSettings.resolve(profile.perf, "dflash", PerfOverrides(dataset=str(SHIPPED_DATASET)))
    assert override.dataset == str(SHIPPED_DATASET)
    assert PerfSettings.resolve({}, "dflash").load_spec(native=True, speculative=True).dataset is None  # synthetic


@pytest.mark.parametrize(("files", "value", "message"), [
    ({}, "missing.jsonl", "missing.jsonl: cannot read the dataset: No such file or directory"),
    ({"p.jsonl": '{"prompt": "a"}\n{"prompt": "b",\n'}, "p.jsonl", "p.jsonl:2: not valid JSON"),
    ({"p.jsonl": "\n"}, "p.jsonl", "p.jsonl: no prompts in the dataset"),
    ({"p.json": '{"data": []}'}, "p.json", "p.json:1: unknown format"),
])
def test_a_bad_profile_dataset_is_one_line_naming_profile_key_and_file(tmp_path: Path, files: dict[str, str],
                                                                       value: str, message: str) -> None:
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    path = _profile(tmp_path, f'dataset = "{value}"\n')
    with pytest.raises(InventoryError) as info:
        load_profile(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text and "perf.dataset" in text and message in text, text


def test_perf_dataset_option_is_checked_at_start(pytester: pytest.Pytester, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "hello"}\n')
    config = pytester.parseconfigure("--perf-dataset", str(good))
    assert config.stash[OPTIONS_KEY].overrides.dataset == str(good.resolve())
    builtin = pytester.parseconfigure("--perf-dataset", "builtin")
    assert builtin.stash[OPTIONS_KEY].overrides.dataset == str(SHIPPED_DATASET)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hello"}\n{"prompt": "x"} trailing\n')
    with pytest.raises(pytest.UsageError, match=r"^--perf-dataset / dflash_perf_dataset: .*bad.jsonl:2: not valid JSON"):
        pytester.parseconfigure("--perf-dataset", str(bad))


@pytest.fixture
def synth_url() -> Iterator[str]:
    """The synthetic server on /generate: 3 then 1 tokens per event (accept length 2 per request), prompts kept."""
    proc = subprocess.Popen([sys.executable, "-m", "pytest_dflash.refserver.synthetic", "--port", "0", "--tokens",
                             "8", "--honor-max-tokens", "--ttft-ms", "1", "--itl-ms", "0", "--tokens-per-event", "3,1",
                             "--record-prompts"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("LISTENING"), line
    try:
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_a_dataset_runs_accept_lengths_are_grouped_per_category(synth_url: str, tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    rows = [("code", "def add(a, b):"), ("math", "What is 7 * 6?"), ("code", "import sys"), ("chat", "Hi there!")]
    dataset.write_text("".join(json.dumps({"category": c, "prompt": p}) + "\n" for c, p in rows))
    settings = PerfSettings(endpoint="generate", concurrency=2, requests=12, warmup=0, output_len=8,
                            dataset=str(dataset), retries=0, max_loop_lag_ms=1e4, max_client_cpu=1e3)  # one run
    run = ServiceRun.measure(host="h", service="dflash", algorithm="DFLASH", url=synth_url, settings=settings,
                             native=True, progress=False)
    assert run.result.metrics["completed"] == 12
    with urllib.request.urlopen(synth_url + "/prompts", timeout=10) as resp:
        received = json.loads(resp.read())["prompts"]
    assert sorted(received) == sorted([p for _, p in rows] * 3)  # exactly the dataset's prompts, cycled
    by_category = run.accept_length_by_category
    assert by_category == {"chat": 2.0, "code": 2.0, "math": 2.0}  # 8 tokens in 4 events (3,1,3,1) each
    metrics = run.metrics()
    assert {k: v for k, v in metrics.items() if k.startswith("perf.dflash.accept_length_by_category.")} == {
        "perf.dflash.accept_length_by_category.chat": 2.0, "perf.dflash.accept_length_by_category.code": 2.0,
        "perf.dflash.accept_length_by_category.math": 2.0}
    assert "per category chat 2.00, code 2.00, math 2.00" in run.headline()
    summary = run.summary()
    assert summary["accept_length_by_category"] == by_category
    assert any("per category chat 2.00, code 2.00, math 2.00" in line for line in summary_lines([summary]))


def test_synthetic_runs_have_no_categories(synth_url: str) -> None:
    settings = PerfSettings(endpoint="generate", concurrency=1, requests=3, warmup=0, prompt_len=4, output_len=8,
                            retries=0)
    run = ServiceRun.measure(host="h", service="dflash", algorithm="DFLASH", url=synth_url, settings=settings,
                             native=True, progress=False)
    assert run.accept_length == 2.0 and run.accept_length_by_category == {}
    assert not any(".accept_length_by_category." in key for key in run.metrics())
