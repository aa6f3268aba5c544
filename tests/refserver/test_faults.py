"""Every --inject fault, observed only from outside the process: exit status, HTTP, log text."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx
import pytest
from refserver_helpers import DATA, Job, run_jobs

from pytest_dflash.refserver.launch import RefServerExited, RefServerProcess
from pytest_dflash.refserver.model import BUILTIN_PROMPTS, ByteTokenizer, TinyLM
from pytest_dflash.refserver.spec import Engine, SamplingParams

TIMEOUT = httpx.Timeout(20.0, connect=5.0)
REAL_LOGS = DATA / "logs"
GREEDY = {"temperature": 0, "max_new_tokens": 16}
SAMPLED = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "max_new_tokens": 16}  # needs FlashInfer's kernel


def generate(server: RefServerProcess, params: dict[str, Any], text: str = "The quick brown fox", **kw: Any) -> httpx.Response:
    return httpx.post(server.url + "/generate", json={"text": text, "sampling_params": params, **kw}, timeout=TIMEOUT)


def in_order(log: str, *needles: str) -> None:
    """Each needle occurs in the log, after the previous one."""
    __tracebackhide__ = True
    at = 0
    for needle in needles:
        found = log.find(needle, at)
        assert found != -1, f"{needle!r} not found (in order) in the log:\n{log[-4000:]}"
        at = found + len(needle)


def died(fault: str, *args: str, timeout_s: float = 30.0) -> tuple[int, str, float]:
    """Start a server that must die on its own; its exit status, log and lifetime."""
    server = RefServerProcess("--inject", fault, *args, wait_ready=False)
    started = time.monotonic()
    with server:
        code = server.wait_exit(timeout_s)
        return code, server.log_text(), time.monotonic() - started


# --- start-up deaths -------------------------------------------------------------------------------


def test_missing_soundfile_dies_at_import_like_seed_000() -> None:
    code, log, _ = died("missing-soundfile")
    assert code == 1
    assert "Uvicorn running" not in log  # the port never opened
    real = (REAL_LOGS / "S1_no_soundfile.log").read_text()
    for text in (real, log):  # same sequence in the recorded SGLang log and here
        in_order(text, "kill_process_tree called: parent_pid=", "include_parent=False", "Traceback (most recent call last):",
                 "import soundfile as sf\n", "ModuleNotFoundError: No module named 'soundfile'")  # fmt: skip
    assert log.rstrip().endswith("ModuleNotFoundError: No module named 'soundfile'")


def test_missing_soundfile_waits_for_its_delay() -> None:
    code, _, lifetime = died("missing-soundfile=1.5")
    assert code == 1 and lifetime >= 1.5


@pytest.mark.parametrize("extra", [(), ("--grammar-backend", "none")])
def test_xgrammar_without_structural_tag_dies_whatever_the_grammar_backend(extra: tuple[str, ...]) -> None:
    code, log, _ = died("xgrammar-structural-tag", *extra)
    assert code == 1
    real = (REAL_LOGS / "S2a_no_StructuralTag_grammar_none.log").read_text()
    for text in (real, log):
        assert text.startswith("Traceback (most recent call last):")  # not a single log line before it
        in_order(text, "from xgrammar import StructuralTag", "ImportError: cannot import name 'StructuralTag' from 'xgrammar' (")


def test_scheduler_crash_at_startup_exits_137_like_sglang() -> None:
    code, log, _ = died("scheduler-crash")
    assert code == 137
    assert "Uvicorn running" not in log
    real = (REAL_LOGS / "S4a_frac_0.99_other_process_holds_gpu.log").read_text()
    for text in (real, log):
        in_order(text, "Scheduler hit an exception: Traceback (most recent call last):", "torch.OutOfMemoryError: CUDA out of memory.",
                 "Received sigquit from a child process. It usually means the child failed.",
                 "kill_process_tree called: parent_pid=", "include_parent=True")  # fmt: skip


def test_block_size_conflict_is_a_startup_value_error() -> None:
    server = RefServerProcess("--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8",
                              "--speculative-dflash-block-size", "16", wait_ready=False)  # fmt: skip
    with server:
        assert server.wait_exit(30) == 1
        in_order(server.log_text(), "Traceback (most recent call last):", "in __post_init__",
                 "ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they "
                 "differ. For DFLASH they must match. speculative_num_draft_tokens=8, speculative_dflash_block_size=16.")  # fmt: skip


def test_launcher_reports_a_death_while_waiting() -> None:
    with pytest.raises(RefServerExited) as err, RefServerProcess("--inject", "scheduler-crash"):
        pass
    assert err.value.returncode == 137 and "Scheduler hit an exception" in err.value.log


# --- run-time deaths ---------------------------------------------------------------------------------


def test_flashinfer_sm120_is_healthy_until_the_first_sampled_request() -> None:
    with RefServerProcess("--inject", "flashinfer-sm120=1") as server:
        assert httpx.get(server.url + "/v1/models", timeout=TIMEOUT).status_code == 200
        assert httpx.get(server.url + "/health_generate", timeout=TIMEOUT).status_code == 200
        assert generate(server, GREEDY).status_code == 200
        assert generate(server, {"temperature": 0.8, "max_new_tokens": 16}).status_code == 200  # torch path
        assert generate(server, {**SAMPLED, "top_k": 1}).status_code == 200  # top_k=1 is greedy
        with pytest.raises(httpx.RemoteProtocolError, match="Server disconnected without sending a response"):
            generate(server, SAMPLED)  # no status line at all: the process died under it
        assert server.wait_exit(10) == 137
        log = server.log_text()
    in_order(log, "Failed to get device capability: SM 12.x requires CUDA >= 12.9.",
             "Scheduler hit an exception: Traceback (most recent call last):",
             'flashinfer/sampling.py", line', "in top_k_top_p_sampling_from_probs\n",
             "    return get_sampling_module().top_k_top_p_sampling_from_probs(\n",
             "           ^^^^^^^^^^^^^^^^^^^^^\n", 'flashinfer/sampling.py", line', "in get_sampling_module\n",
             "RuntimeError: FlashInfer requires GPUs with sm75 or higher",
             "SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
             "Sleeping 5 seconds before crash diagnostics to let GPU activity settle.",
             "No live scheduler processes found; skipping py-spy and CUDA coredump.",
             "kill_process_tree called: parent_pid=", "include_parent=True")  # fmt: skip
    assert log.count('"POST /generate HTTP/1.1" 200 OK') == 4  # warm-up + 3; none for the killed request
    real = (REAL_LOGS / "S3a_sampling_jit_nvcc_bad_flag.log").read_text()  # the same frames in real SGLang
    in_order(real, "Scheduler hit an exception: Traceback", "in top_k_top_p_sampling_from_probs\n",
             "    return get_sampling_module().top_k_top_p_sampling_from_probs(\n", "in get_sampling_module\n",
             "SIGQUIT received. signum=None, frame=None. It usually means one child failed.")  # fmt: skip


def test_flashinfer_sm120_spares_the_pytorch_sampling_backend() -> None:
    with RefServerProcess("--inject", "flashinfer-sm120=1", "--sampling-backend", "pytorch") as server:
        assert generate(server, SAMPLED).status_code == 200
        assert server.returncode is None


def test_oom_kill_sigkills_after_n_requests_without_a_word() -> None:
    with RefServerProcess("--inject", "oom-kill=2") as server:
        assert generate(server, GREEDY).status_code == 200
        assert generate(server, GREEDY).status_code == 200
        assert server.wait_exit(10) == 137
        log = server.log_text()
    assert "Traceback" not in log and "kill_process_tree" not in log
    with pytest.raises(httpx.ConnectError):
        generate(server, GREEDY)


def test_oom_kill_answers_nothing_after_the_fatal_response() -> None:
    # A request right behind the fatal one is dropped by the kill, however fast the server would have been.
    with RefServerProcess("--inject", "oom-kill=1") as server:
        assert generate(server, GREEDY).status_code == 200
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError)):
            generate(server, GREEDY)
        assert server.wait_exit(10) == 137


def test_crash_after_ends_with_a_traceback_and_status_1() -> None:
    code, log, lifetime = died("crash-after=1.5")
    assert code == 1 and lifetime >= 1.5
    in_order(log, "Uvicorn running on", "kill_process_tree called: parent_pid=", "include_parent=False",
             "Traceback (most recent call last):", "RuntimeError: ")  # fmt: skip


def test_sigterm_drains_then_ends_like_sglang() -> None:
    with RefServerProcess() as server:
        server.signal(15)
        assert server.wait_exit(15) == 137  # SGLang ends by SIGKILLing its own process tree
        in_order(server.log_text(), "SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
                 "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].",
                 "kill_process_tree called: parent_pid=", "include_parent=True")  # fmt: skip


# --- misbehaviour while alive ------------------------------------------------------------------------


def test_hang_swallows_the_nth_request_and_serves_the_others() -> None:
    with RefServerProcess("--inject", "hang=2") as server:
        assert generate(server, GREEDY).status_code == 200
        hung: list[BaseException] = []

        def second() -> None:
            try:
                httpx.post(server.url + "/generate", json={"text": "x", "sampling_params": GREEDY},
                           timeout=httpx.Timeout(3.0, connect=5.0))  # fmt: skip
            except httpx.ReadTimeout as e:
                hung.append(e)

        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.3)
        assert generate(server, GREEDY).status_code == 200  # the third request is served meanwhile
        assert httpx.get(server.url + "/health_generate", timeout=TIMEOUT).status_code == 200
        assert httpx.post(server.url + "/flush_cache", timeout=TIMEOUT).status_code == 400  # a request "runs"
        t.join(timeout=10)
        assert hung, "the second request got an answer"


def test_truncated_stream_ends_without_done() -> None:
    with RefServerProcess("--inject", "truncated-stream") as server:
        body = {"text": "stream", "sampling_params": {"temperature": 0, "max_new_tokens": 32}, "stream": True}
        r = httpx.post(server.url + "/generate", json=body, timeout=TIMEOUT)
        assert r.status_code == 200
        events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
        assert events and "[DONE]" not in events
        last = json.loads(events[-1])
        assert last["meta_info"]["finish_reason"] is None and len(last["output_ids"]) < 32
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32, "stream": True}
        r = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=TIMEOUT)
        assert "data: [DONE]" not in r.text and '"finish_reason":"length"' not in r.text
        assert generate(server, GREEDY).json()["meta_info"]["completion_tokens"] == 16  # not streamed: fine


def test_bad_json_breaks_generation_bodies_only() -> None:
    with RefServerProcess("--inject", "bad-json") as server:
        r = generate(server, GREEDY)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        with pytest.raises(json.JSONDecodeError):
            json.loads(r.text)
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
        with pytest.raises(json.JSONDecodeError):
            json.loads(httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=TIMEOUT).text)
        assert httpx.get(server.url + "/v1/models", timeout=TIMEOUT).json()["object"] == "list"


def test_tree_verify_bug_diverges_from_the_target_at_temperature_zero(model: TinyLM) -> None:
    tok = ByteTokenizer()
    ref = run_jobs(Engine(model, "NONE"), [Job(tok.encode(p), SamplingParams(top_k=1, max_new_tokens=48))
                                           for p in BUILTIN_PROMPTS])  # fmt: skip
    with RefServerProcess("--speculative-algorithm", "DDTREE", "--inject", "tree-verify-bug") as server:
        outs = [generate(server, {"temperature": 0, "max_new_tokens": 48}, text=p).json()["output_ids"]
                for p in BUILTIN_PROMPTS]  # fmt: skip
    assert sum(a != b.output_ids for a, b in zip(outs, ref, strict=True)) >= 1


def test_greedy_fallback_logs_the_sglang_line_and_ignores_temperature() -> None:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "greedy-fallback") as server:
        assert re.search(r"^\[[\d\- :]+\] DFLASH non-greedy verification is unavailable on this build/device; "
                         r"falling back to greedy argmax verification\.$", server.log_text(), re.M)  # fmt: skip
        tok = ByteTokenizer()
        prompt = tok.encode("Once upon a time")
        for seed in (1, 2, 3):
            out = generate(server, {"temperature": 1.0, "max_new_tokens": 24, "sampling_seed": seed}, text="Once upon a time")
            ids = out.json()["output_ids"]
            greedy = httpx.post(server.url + "/generate", json={"input_ids": prompt + ids[:1], "sampling_params":
                                {"temperature": 0, "max_new_tokens": 23}}, timeout=TIMEOUT).json()  # fmt: skip
            assert ids[1:] == greedy["output_ids"]  # after the prefill token: the greedy continuation


def test_slow_decode_cuts_throughput(none_server: RefServerProcess) -> None:
    params = {"temperature": 0, "max_new_tokens": 96}
    fast = min(generate(none_server, params).json()["meta_info"]["e2e_latency"] for _ in range(3))
    with RefServerProcess("--inject", "slow-decode=5") as server:
        slow = min(generate(server, params).json()["meta_info"]["e2e_latency"] for _ in range(3))
    assert slow > 2.5 * fast, (slow, fast)  # best of 3 each: other jobs on the machine only add noise


# --- not ready yet -----------------------------------------------------------------------------------


def statuses_until_ready(server: RefServerProcess, deadline_s: float) -> tuple[list[int | None], float]:
    """Poll /health_generate until 200; the statuses seen and when 200 came (from launch)."""
    seen: list[int | None] = []
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        seen.append(server.get_status("/health_generate"))
        if seen[-1] == 200:
            return seen, time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"never ready: {seen[-10:]}")


def test_slow_load_answers_models_at_once_and_health_only_later() -> None:
    server = RefServerProcess("--inject", "slow-load=2.5", wait_ready=False)
    with server:
        launched = time.monotonic()
        server.wait_port()
        assert httpx.get(server.url + "/v1/models", timeout=TIMEOUT).status_code == 200
        early = {}

        def early_request() -> None:  # sent while loading: waits, then succeeds
            early["r"] = generate(server, GREEDY)

        t = threading.Thread(target=early_request)
        t.start()
        seen, ready_at = statuses_until_ready(server, 30)
        t.join(timeout=20)
    assert 503 in seen and ready_at - launched >= 2.5
    assert early["r"].status_code == 200


def test_cold_jit_blocks_warmup_and_the_first_sampled_request() -> None:
    server = RefServerProcess("--inject", "cold-jit=2", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "0.5"}, wait_ready=False)
    with server:
        launched = time.monotonic()
        server.wait_port()
        seen, ready_at = statuses_until_ready(server, 30)
        assert 503 in seen and ready_at - launched >= 2.0
        assert generate(server, GREEDY).status_code == 200
        result = {}

        def first_sampled() -> None:
            t0 = time.monotonic()
            result["status"] = generate(server, SAMPLED).status_code
            result["seconds"] = time.monotonic() - t0

        t = threading.Thread(target=first_sampled)
        t.start()
        time.sleep(0.3)
        assert server.get_status("/health_generate", timeout_s=5) == 503  # the scheduler is busy compiling
        t.join(timeout=20)
        assert result["status"] == 200 and result["seconds"] >= 1.5
        t0 = time.monotonic()
        assert generate(server, SAMPLED).status_code == 200 and time.monotonic() - t0 < 1.5  # compiled now
        log = server.log_text()
    assert re.search(r"Health check failed\. Server couldn't get a response from detokenizer for last 0\.5 seconds\. "
                     r"tic start time: \d\d:\d\d:\d\d\. last_heartbeat time: \d\d:\d\d:\d\d", log)  # fmt: skip
