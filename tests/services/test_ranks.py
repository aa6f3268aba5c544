"""Tensor-parallel start-ups and failures read from SGLang's per-rank lines (services/phases.py, services/ranks.py):
` TP{i}` time stamps, NCCL init per rank, a rank's death with its pid and GPU, a stopped rank found by `ps`."""

from __future__ import annotations

import datetime as dt

from pytest_dflash.services.phases import describe_in_progress, describe_ranks, nccl_init_stuck, parse_startup
from pytest_dflash.services.ranks import (
    last_rank_lines,
    rank_on_gpu,
    rank_processes,
    ranks_named_in_log,
    tensor_parallel_wedge,
    tp_size_of,
)

TP_LOG = """\
[2026-12-04 21:29:29] server_args=ServerArgs(model_path='/m', tp_size=2)
[2026-12-04 21:29:48 TP0] Init torch distributed begin.
[2026-12-04 21:29:48 TP1] Init torch distributed begin.
[2026-12-04 21:29:49 TP0] Init torch distributed ends. elapsed=0.94 s, mem usage=0.09 GB
[2026-12-04 21:29:50 TP0] Load weight begin. avail mem=139.13 GB
[2026-12-04 21:29:51 TP0] Load weight end. elapsed=0.10 s, type=Qwen3ForCausalLM, avail mem=139.12 GB, mem usage=0.01 GB.
[2026-12-04 21:29:51 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 21844118, K size: 20.83 GB, V size: 20.83 GB
[2026-12-04 21:29:51 TP0] Memory pool end. avail mem=97.20 GB
"""
EPOCH = dt.datetime(2026, 12, 4, 21, 29, 48, tzinfo=dt.UTC).timestamp()


def test_rank_lines_are_read_and_the_phases_follow_rank_0() -> None:
    log = parse_startup(TP_LOG + "[2026-12-04 21:29:52 TP0] max_total_num_tokens=21844118\n")
    assert set(log.ranks) == {"TP0", "TP1"}
    assert log.ranks["TP1"].in_nccl_init and not log.ranks["TP0"].in_nccl_init
    assert log.ranks["TP1"].tp_rank == 1
    assert "kv_cache_allocated" in log.ends and "weights_loaded" in log.ends  # TP0's lines, as on one GPU


def test_a_rank_in_nccl_init_past_its_budget_is_named() -> None:
    log = parse_startup(TP_LOG)
    stuck, longest = nccl_init_stuck(log, now=EPOCH + 130, utc_offset_s=0.0, budget_s=120)
    assert [r.label for r in stuck] == ["TP1"] and 129 < longest < 131
    assert nccl_init_stuck(log, now=EPOCH + 60, utc_offset_s=0.0, budget_s=120) == ([], 0.0)
    assert describe_ranks(log, now=EPOCH + 40, utc_offset_s=0.0) == "TP1 in NCCL init for 40.0s (TP0 done)"
    assert describe_in_progress(log, now=EPOCH + 40, waited_from=EPOCH - 20, utc_offset_s=0.0) == (
        "TP1 in NCCL init for 40.0s (TP0 done)")


def test_a_heartbeat_names_the_slowest_rank() -> None:
    log = parse_startup(TP_LOG + "[2026-12-04 21:29:50 TP1] Init torch distributed ends. elapsed=2.0 s\n"
                        "[2026-12-04 21:29:50 TP1] Load weight begin. avail mem=139.13 GB\n")
    doing = describe_in_progress(log, now=EPOCH + 30, waited_from=EPOCH - 20, utc_offset_s=0.0)
    assert doing.endswith("; slowest rank TP1: last line 28.0s ago (Load weight begin. avail mem=139.13 GB)")


def test_a_ranks_death_is_named_with_its_pid_and_gpu() -> None:
    died = ("[2026-12-04 23:47:52] Subprocess scheduler_1 (pid=25274) crashed with exit code -9. Triggering "
            "SIGQUIT for cleanup...\n")
    assert ranks_named_in_log(died, [4, 5]) == [
        "tensor-parallel rank TP1 (GPU 5) died: scheduler_1 pid 25274, killed by SIGKILL (OOM killer, Xid or an "
        "operator)"]
    failed = ("[2026-12-04 23:40:46 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
              '  File "x.py", line 1, in <module>\nRuntimeError: Not enough memory. Please try to increase '
              "--mem-fraction-static.\n")
    assert ranks_named_in_log(failed, []) == [
        "tensor-parallel rank TP1 (visible GPU 1) failed at start-up: RuntimeError: Not enough memory. Please try "
        "to increase --mem-fraction-static."]
    assert ranks_named_in_log("[2026-12-04 23:40:46] Load weight end.\n", [0]) == []
    assert rank_on_gpu("PP0 TP3", [4, 5, 6, 7]) == "PP0 TP3 (GPU 7)"


PS = """\
  100     1 Ssl  /venv/bin/python -m sglang.launch_server --tp-size 2
  101   100 Sl   sglang::scheduler_TP0
  102   100 Tl   sglang::scheduler_TP1
  103   100 S    sglang::detokenizer
  200     1 Sl   sglang::scheduler_TP0
"""


def test_a_stopped_rank_is_found_below_its_server() -> None:
    assert rank_processes(PS, 100) == {0: (101, "Sl"), 1: (102, "Tl")}
    assert rank_processes(PS, None)[0] == (200, "Sl")  # another server's rank, when no pid is known
    note = tensor_parallel_wedge(2, [4, 5], ps_text=PS, main_pid=100, log=TP_LOG)
    assert note.startswith("the engine is tensor-parallel (--tp-size 2")
    assert "rank TP1 (GPU 5) (sglang::scheduler_TP1, pid 102) is stopped (SIGSTOP or a debugger)" in note
    assert "the rank whose log went quiet first: TP1 (GPU 5), last line [2026-12-04 21:29:48 TP1]" in note
    running = tensor_parallel_wedge(2, [], ps_text=PS.replace(" Tl ", " Sl "), main_pid=100)
    assert "every rank process is running (state TP0=Sl, TP1=Sl)" in running
    assert tensor_parallel_wedge(1, [0], ps_text=PS, main_pid=100) == ""


def test_tp_size_from_server_info_else_from_the_command() -> None:
    assert tp_size_of(["-m", "sglang.launch_server", "--tp", "4"], None) == 4
    assert tp_size_of([], {"tp_size": 8}) == 8
    assert tp_size_of(["--tp-size", "{tp}"], {}) == 1
    assert last_rank_lines(TP_LOG)["TP1"] == "[2026-12-04 21:29:48 TP1] Init torch distributed begin."
