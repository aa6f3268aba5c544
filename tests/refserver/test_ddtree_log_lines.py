"""The refserver's DDTREE start-up and first-verify lines have the shape the real ddtree-v2 port logs (recorded
on the H200: tests/data/sglang-0.5.17-h200-ddtree/run2-three/server_ddtree.log), so evidence, diagnosis and the
catalog see the same text from both."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from pytest_dflash.evidence.diagnosis import diagnose
from pytest_dflash.refserver.launch import RefServerProcess

REAL = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-ddtree" / "run2-three" / "server_ddtree.log"
LINES = {
    "grammar": r"DDTREE does not support grammar-constrained decoding; setting --grammar-backend none \(was "
               r"'xgrammar'\) so such requests are rejected instead of crashing the scheduler\.",
    "draft": r"Initialized DFLASH draft runner\. attention_backend=\w+, model=\w+, block_size=\d+, "
             r"draft_window_size=None, compact_cache=False",
    "worker": r"Initialized DDTREE v2 worker\. block_size=(\d+), tree_budget=(\d+), max_tree_nodes=(\d+), "
              r"prune=False, tree_attention=False, cpu_build=False, cpu_follow=False, graph_buckets=\[\d+\]",
    "verify": r"DDTREE v2 verify completed\. first commit_lens=\[(\d+(?:, \d+)*)\]",
}


def _find(text: str) -> dict[str, re.Match[str]]:
    return {name: m for name, pattern in LINES.items() if (m := re.search(pattern, text))}


def test_the_verify_line_lists_every_request_of_the_batch() -> None:
    """On the high-acceptance pair the warm-up and the plugin's first request shared a verify step (run 3)."""
    real = (REAL.parents[1] / "run3-configs2" / "server_ddtree_acc_fi.log").read_text(errors="replace")
    match = re.search(LINES["verify"], real)
    assert match is not None and match.group(1) == "5, 5"


def test_the_patterns_are_the_real_servers_lines() -> None:
    found = _find(REAL.read_text(errors="replace"))
    assert set(found) == set(LINES)
    assert found["worker"].groups() == ("16", "32", "33") and found["verify"].group(1) == "1"


@pytest.mark.parametrize(("log", "budget"), [
    ("run4-configs-parity/server_ddtree_acc_graphs.log", "32"), ("run4-configs-parity/server_ddtree_acc_overlap.log", "32"),
    ("run4-configs-parity/server_ddtree_acc_prod.log", "32"), ("run4-fi-parity/server_ddtree_acc_fi.log", "32"),
    ("run4-accept/server_ddtree_acc_b8.log", "8"),
])
def test_every_configuration_logs_the_same_lines(log: str, budget: str) -> None:
    """CUDA graphs, overlap scheduling, both, the flashinfer backend (run 4): the lines do not change with them,
    and a healthy run of each gives the catalog nothing to flag."""
    text = (REAL.parents[1] / log).read_text(errors="replace")
    found = _find(text)
    assert set(found) == set(LINES), log
    assert found["worker"].group(2) == budget and found["worker"].group(3) == str(int(budget) + 1)
    assert diagnose(text) == []


def test_the_refserver_logs_them_in_the_real_order_and_the_catalog_names_none_of_them() -> None:
    with RefServerProcess("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8") as server:
        response = httpx.post(f"{server.url}/generate", json={"text": "Hello", "sampling_params": {
            "max_new_tokens": 4, "temperature": 0}}, timeout=30)
        assert response.status_code == 200
        deadline = time.monotonic() + 10
        while "verify completed" not in server.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = server.log_text()
    found = _find(text)
    assert set(found) == set(LINES), text[-3000:]
    assert found["worker"].group(2) == "8" and found["worker"].group(3) == "9"
    positions = [found[name].start() for name in ("grammar", "draft", "worker", "verify")]
    assert positions == sorted(positions)
    assert "grammar_backend='none'" in text  # the server_args line after the switch, as real SGLang prints it
    assert diagnose(text) == []  # healthy start-up lines: nothing for the catalog to flag
