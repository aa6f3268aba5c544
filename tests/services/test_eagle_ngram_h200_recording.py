"""EAGLE (v1) and NGRAM beside plain on real SGLang 0.5.17 through every suite (a lent H200, 2026-12-03;
tests/data/sglang-0.5.17-h200-eagle-ngram/), read by the functions the suites use (issue 25 item 4)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.layers.parity.acceptance import DEFAULT_MIN_ACCEPT_LENGTH, required_floor
from pytest_dflash.services.phases import parse_startup
from pytest_dflash.services.speculation import compare, requested_speculation, server_args_from_log

DATA = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-eagle-ngram" / "run1"
PROFILE = load_profile(Path(__file__).parents[2] / "tools" / "device" / "h200-eagle-ngram.toml")
ACCEPT = re.compile(r"accept len: ([0-9.]+), accept rate: ([0-9.]+)")
RESET_NOTE = "max_running_requests was reset for speculative decoding (set --max-running-requests to choose it)"


def _log(service: str) -> str:
    return (DATA / f"{service}.server.log").read_text()


def _verdict() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "h200-eagle-ngram.verdict.json").read_text())
    return data


def test_every_suite_passed_and_the_verdict_is_a_whole_pass() -> None:
    """All eight suites on one freshly provisioned host: 199 passed, 13 skipped (no baseline, no cold-start budget,
    plain has no speculation, no DFLASH/DDTREE pair), nothing lost: a `pass` of the whole host, not `partial`."""
    verdict = _verdict()
    assert (verdict["verdict"], verdict["complete"], verdict["partial"], verdict["failures"]) == (
        "pass", True, [], [])
    assert verdict["selection"]["collected"] == verdict["selection"]["finished"] == 212
    assert {name: layer["outcome"] for name, layer in verdict["layers"].items()} == dict.fromkeys(
        ("host", "env", "kernels", "service", "generation", "parity", "perf"), "passed")
    assert "199 passed, 13 skipped" in (DATA / "pytest.log").read_text()


@pytest.mark.parametrize("service", ["eagle", "ngram"])
def test_the_served_speculation_is_what_the_profile_asked(service: str) -> None:
    """The log's ServerArgs and the verdict's /server_info facts agree and match the profile's flags: EAGLE's tree
    (3 steps, topk 2, 6 draft tokens) and NGRAM's 8 draft tokens, only SGLang's max_running_requests reset as a
    note."""
    spec = PROFILE.services[service]
    log = _log(service)
    served = server_args_from_log(log)
    assert served == _verdict()["services"][service]["speculation"]
    findings = compare(requested_speculation(spec.command), served, log, algorithm=spec.algorithm)
    assert findings.failures == []
    assert [n.split(";")[0] for n in findings.notes] == [RESET_NOTE]


def test_the_eagle_head_loaded_as_sglangs_eagle_model_and_shares_the_targets_embedding() -> None:
    """make_spec_drafts.py's head is loaded by SGLang's own EAGLE class (llama_eagle.py), after the target."""
    loads = re.findall(r"Load weight end\. .*?type=(\w+)", _log("eagle"))
    assert loads == ["Qwen3ForCausalLM", "LlamaForCausalLMEagle"]


def test_ngram_really_accepts_and_the_random_eagle_head_accepts_nothing() -> None:
    """Decode-batch lines and meta_info agree: NGRAM ~4.8 tokens per verify step on this model's repetitive
    text, far above the default minimum; the random EAGLE head 1.00, which passes only because the profile
    declares `unaccepted_draft`."""
    verdict = _verdict()
    ngram = [float(m.group(1)) for m in ACCEPT.finditer(_log("ngram"))]
    eagle = [float(m.group(1)) for m in ACCEPT.finditer(_log("eagle"))]
    assert len(ngram) > 20 and len(eagle) > 100
    assert statistics.median(ngram) > 2.5 and max(eagle) <= 1.02
    assert verdict["metrics"]["acceptance:ngram"]["mean"] > 4.5 > DEFAULT_MIN_ACCEPT_LENGTH
    assert verdict["metrics"]["acceptance:eagle"]["mean"] < DEFAULT_MIN_ACCEPT_LENGTH
    eagle_spec, ngram_spec = PROFILE.services["eagle"], PROFILE.services["ngram"]
    assert required_floor("eagle", {}, unaccepted_draft=eagle_spec.unaccepted_draft, source="p").value == 1.0
    assert required_floor("ngram", {}, unaccepted_draft=ngram_spec.unaccepted_draft,
                          source="p").value == DEFAULT_MIN_ACCEPT_LENGTH


def test_both_are_lossless_and_ngrams_one_greedy_departure_was_a_tie() -> None:
    """Greedy parity: EAGLE 7/7 identical; NGRAM 6/7, its one departure a numerical tie (within tie_gap), and
    under a 7-way concurrent batch one departure classified noise (the service gives plain's token again alone):
    neither a real divergence. Distribution parity passed for both (the verdict's failures are empty)."""
    metrics = _verdict()["metrics"]
    assert metrics["parity:plain~eagle"]["exact"] == metrics["parity-concurrent:plain~eagle"]["exact"] == 7
    greedy, concurrent = metrics["parity:plain~ngram"], metrics["parity-concurrent:plain~ngram"]
    assert (greedy["exact"], greedy["ties"], greedy["real"]) == (6, 1, 0)
    assert (concurrent["exact"], concurrent["noise"], concurrent["real"]) == (6, 1, 0)
    assert all(d["kind"] in ("tie", "noise") for d in greedy["divergences"] + concurrent["divergences"])
    assert metrics["distribution:plain~eagle"]["outcome"] == metrics["distribution:plain~ngram"]["outcome"] == "pass"


def test_ngram_is_faster_than_plain_and_the_random_eagle_head_is_pure_cost() -> None:
    """Perf (concurrency 4, 80 requests of 64 tokens, CUDA graphs off): NGRAM 2.35x plain [2.23, 2.47] -- drafts
    that cost no model forward and are accepted ~4.6 at a time; EAGLE 0.41x [0.39, 0.43] -- every draft step
    spent and rejected. Both judged on the lower bound against the profile's sanity floor (0.25)."""
    metrics = _verdict()["metrics"]
    for service, (low, high) in (("ngram", (2.0, 2.6)), ("eagle", (0.3, 0.5))):
        lower, value, upper = (metrics[f"perf.{service}.speedup_vs_plain{s}"] for s in (".lower", "", ".upper"))
        assert low <= lower <= value <= upper <= high
        assert lower > float(PROFILE.floors[service]["speedup"])
    assert metrics["perf.ngram.accept_length"] > 4.0 and metrics["perf.eagle.accept_length"] < 1.02


@pytest.mark.parametrize("service", ["plain", "eagle", "ngram"])
def test_each_start_up_by_phase(service: str) -> None:
    """Graphs off: weights, KV pools and the port, in that order, for each algorithm's server (a warm machine:
    each ready within a minute, first sampled request under 0.3 s)."""
    ends = parse_startup(_log(service)).ends
    assert list(ends) == ["process_started", "weights_loaded", "kv_cache_allocated", "port_open"]
    assert list(ends.values()) == sorted(ends.values())
    assert _verdict()["services"][service]["ready"]["total_s"] < 60
