"""--mimic-version wired into a real refserver process: a later release's /server_info, /model_info,
meta_info and routes, its refusal of the flags it removed, and the 0.5.17 default unchanged."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from refserver_helpers import get, post

from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.refserver.mimic import META_ALIASES

GENERATE = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 12}}
LATER = ["--speculative-algorithm", "DFLASH", "--speculative-draft-window-size", "512",
         "--cuda-graph-max-bs-decode", "8"]


@pytest.fixture(scope="module")
def later_server() -> Iterator[RefServerProcess]:
    with RefServerProcess("--mimic-version", "0.5.23", *LATER, "--served-model-name", "tiny") as server:
        yield server


def test_a_0_5_23_server_answers_in_0_5_23_shapes(later_server: RefServerProcess) -> None:
    info = get(later_server, "/server_info").json()
    assert info["version"] == "0.5.23" and info["frontend"] == "python"
    assert info["launch_command"].startswith("python3 -m sglang.launch_server ")
    assert "--mimic-version" not in info["launch_command"] and "--speculative-draft-window-size 512" in info[
        "launch_command"]
    assert info["speculative_draft_window_size"] == 512 and info["cuda_graph_max_bs"] == 8
    assert "mimic" not in info
    assert get(later_server, "/model_info").json()["served_model_name"] == "tiny"
    meta = post(later_server, "/generate", GENERATE).json()["meta_info"]
    assert meta["spec_verify_ct"] > 0 and meta["spec_num_correct_drafts"] >= 0
    assert not set(META_ALIASES) & set(meta)


def test_a_0_5_23_server_serves_ready_and_no_get_load(later_server: RefServerProcess) -> None:
    assert get(later_server, "/ready").status_code == 200
    assert get(later_server, "/get_load").status_code == 404
    assert get(later_server, "/v1/models").status_code == 200


@pytest.mark.parametrize("flag", ["--speculative-dflash-draft-window-size", "--cuda-graph-max-bs"])
def test_a_flag_0_5_23_removed_exits_2_as_argparse(flag: str) -> None:
    argv = [sys.executable, "-m", "pytest_dflash.refserver", "--mimic-version", "0.5.23", flag, "8"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"error: unrecognized arguments: {flag} 8" in done.stderr


def test_the_default_is_0_5_17_and_warns_of_the_aliases_it_still_takes() -> None:
    argv = ["--speculative-algorithm", "DFLASH", "--speculative-dflash-draft-window-size", "512"]
    with RefServerProcess(*argv) as server:
        info = get(server, "/server_info").json()
        assert info["version"] == "0.5.17" and "launch_command" not in info and "frontend" not in info
        assert info["speculative_draft_window_size"] == 512
        assert "served_model_name" not in get(server, "/model_info").json()
        meta = post(server, "/generate", GENERATE).json()["meta_info"]
        assert set(META_ALIASES) <= set(meta)
        assert get(server, "/ready").status_code == 404  # 0.5.20 added it
        assert get(server, "/get_load").status_code == 200
        log = server.log_text()
    assert ("'--speculative-dflash-draft-window-size' is deprecated and will be removed in a future release. "
            "Use '--speculative-draft-window-size' instead.") in log
