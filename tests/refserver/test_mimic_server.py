"""--mimic-version wired into a real refserver process: a later release's /server_info, /model_info,
meta_info and routes, its refusal of the flags it removed, the health bypass (0.5.19+), /ready and /ping of a
paused server, and the 0.5.17 default unchanged."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from refserver_helpers import get, post

from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.refserver.mimic import BYPASS_ENV, META_ALIASES

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
    # the arguments as SGLang joins sys.argv[1:] (no program), less --mimic-version
    assert info["launch_command"] == " ".join(["--host", "127.0.0.1", "--port", "0", *LATER,
                                               "--served-model-name", "tiny"])
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


@pytest.mark.parametrize(("version", "value", "bypassed"), [
    ("0.5.19", "1", True),  # 0.5.19 added it (sglang/srt/entrypoints/http_server.py:680)
    ("0.5.23", "Yes", True),  # EnvBool: "true", "1", "yes", "y" in any case
    ("0.5.18", "1", False),  # not there yet: the variable means nothing
    ("0.5.23", "on", False),  # not an EnvBool value: SGLang warns and keeps the default, False
], ids=["0.5.19-1", "0.5.23-Yes", "0.5.18-1", "0.5.23-on"])
def test_the_health_bypass_answers_200_while_the_engine_is_wedged(version: str, value: str, bypassed: bool) -> None:
    env = {BYPASS_ENV: value, "SGLANG_HEALTH_CHECK_TIMEOUT": "3"}  # wide apart from "at once" on a busy host
    with RefServerProcess("--mimic-version", version, "--inject", "wedge=1", env=env) as server:
        assert post(server, "/generate", GENERATE).status_code == 200  # the one request it serves
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/generate", json=GENERATE, timeout=1.5)  # wedged from here on
        started = time.monotonic()
        status = get(server, "/health_generate").status_code
        took = time.monotonic() - started
    if bypassed:  # 200 at once, no generation: a wedged engine looks healthy
        assert status == 200 and took < 2.0, (status, took)
    else:  # the 1-token generation never gets through: 503 after SGLANG_HEALTH_CHECK_TIMEOUT
        assert status == 503 and took >= 2.9, (status, took)


def test_a_paused_0_5_23_server_says_so_on_ready_and_ping_and_resumes() -> None:
    with RefServerProcess("--mimic-version", "0.5.23", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}) as server:
        assert (get(server, "/ready").status_code, get(server, "/ping").status_code) == (200, 200)
        assert post(server, "/pause_generation", {"mode": "abort"}).status_code == 400  # not mimicked
        paused = post(server, "/pause_generation", {"mode": "in_place"})
        assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
        # paused: not ready, still healthy (0.5.23: "Unlike /ready, a paused server still reports 200")
        assert (get(server, "/ready").status_code, get(server, "/ping").status_code) == (503, 200)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/generate", json=GENERATE, timeout=1.5)  # taken, not generated
        # a health check cannot get a token through either: 503, and the server is marked unhealthy
        assert get(server, "/health_generate").status_code == 503
        assert (get(server, "/ready").status_code, get(server, "/ping").status_code) == (503, 503)
        assert post(server, "/continue_generation", {}).json()["status"] == "ok"
        assert post(server, "/generate", GENERATE).status_code == 200
        assert get(server, "/health_generate").status_code == 200  # a health check that passes: up again
        assert (get(server, "/ready").status_code, get(server, "/ping").status_code) == (200, 200)


def test_before_0_5_23_ping_answers_200_even_when_unhealthy() -> None:
    with RefServerProcess("--mimic-version", "0.5.22", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}) as server:
        post(server, "/pause_generation", {"mode": "retract"})
        assert get(server, "/health_generate").status_code == 503
        assert (get(server, "/ready").status_code, get(server, "/ping").status_code) == (503, 200)
