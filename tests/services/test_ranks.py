"""Tensor-parallel start-ups and failures read from SGLang's per-rank lines (services/phases.py, services/ranks.py):
` TP{i}` time stamps, NCCL init per rank, a rank's death with its pid and GPU, a stopped rank found by `ps`."""

from __future__ import annotations

import datetime as dt

from pytest_dflash.errors import RankFault
from pytest_dflash.services.phases import describe_in_progress, describe_ranks, nccl_init_stuck, parse_startup
from pytest_dflash.services.ranks import (
    last_rank_lines,
    rank_faults_in_log,
    rank_on_gpu,
    rank_processes,
    stopped_ranks,
    tensor_parallel_wedge,
    tp_mismatch,
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


def test_a_rank_that_began_nccl_init_later_is_stuck_with_the_first_not_past_it() -> None:
    """On a loaded host TP1 may log its `begin` a second after TP0: when TP0 crosses the budget, TP1 waits on
    the same communicator and is named with it (CI once read 'TP0 stuck ...; TP1 got past it')."""
    log = parse_startup("[2026-12-04 21:29:48 TP0] Init torch distributed begin.\n"
                        "[2026-12-04 21:29:49 TP1] Init torch distributed begin.\n")
    stuck, longest = nccl_init_stuck(log, now=EPOCH + 4.1, utc_offset_s=0.0, budget_s=4.0)
    assert [r.label for r in stuck] == ["TP0", "TP1"] and 4.0 < longest < 4.2
    assert nccl_init_stuck(log, now=EPOCH + 3.9, utc_offset_s=0.0, budget_s=4.0) == ([], 0.0)


def test_a_heartbeat_names_the_slowest_rank() -> None:
    log = parse_startup(TP_LOG + "[2026-12-04 21:29:50 TP1] Init torch distributed ends. elapsed=2.0 s\n"
                        "[2026-12-04 21:29:50 TP1] Load weight begin. avail mem=139.13 GB\n")
    doing = describe_in_progress(log, now=EPOCH + 30, waited_from=EPOCH - 20, utc_offset_s=0.0)
    assert doing.endswith("; slowest rank TP1: last line 28.0s ago (Load weight begin. avail mem=139.13 GB)")


def test_a_ranks_death_is_named_with_its_pid_and_gpu() -> None:
    died = ("[2026-12-04 23:47:52] Subprocess scheduler_1 (pid=25274) crashed with exit code -9. Triggering "
            "SIGQUIT for cleanup...\n")
    (fault,) = rank_faults_in_log(died, [4, 5], when="serving")
    assert fault == RankFault(1, "died", "killed by SIGKILL", 25274, "GPU 5", when="serving")
    assert fault.sentence() == "tensor-parallel rank TP1 (rank 1, pid 25274, GPU 5) died while serving: killed by SIGKILL"
    assert fault.as_dict()["said"] == fault.sentence() and fault.as_dict()["pid"] == 25274
    segv = died.replace("scheduler_1 (pid=25274)", "scheduler_0 (pid=7)").replace("-9.", "-11.")
    assert rank_faults_in_log(segv, [])[0].how == "killed by SIGSEGV"
    failed = ("[2026-12-04 23:40:46 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
              '  File "x.py", line 1, in <module>\nRuntimeError: Not enough memory. Please try to increase '
              "--mem-fraction-static.\n")
    (fault,) = rank_faults_in_log(failed, [])
    assert fault.sentence() == ("tensor-parallel rank TP1 (rank 1, visible GPU 1) failed at start-up: RuntimeError: "
                                "Not enough memory. Please try to increase --mem-fraction-static.")
    assert rank_faults_in_log("[2026-12-04 23:40:46] Load weight end.\n", [0]) == []
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
    note, faults = tensor_parallel_wedge(2, [4, 5], ps_text=PS, main_pid=100, log=TP_LOG)
    assert note.startswith("the engine is tensor-parallel (--tp-size 2")
    assert ("tensor-parallel rank TP1 (rank 1, pid 102, GPU 5) stopped while serving: SIGSTOP or a debugger "
            "(process state T) (sglang::scheduler_TP1)") in note
    assert faults == [RankFault(1, "stopped", "SIGSTOP or a debugger (process state T)", 102, "GPU 5",
                                when="serving")]
    assert "the rank whose log went quiet first: TP1 (GPU 5), last line [2026-12-04 21:29:48 TP1]" in note
    running, none = tensor_parallel_wedge(2, [], ps_text=PS.replace(" Tl ", " Sl "), main_pid=100)
    assert "every rank process is running (state TP0=Sl, TP1=Sl)" in running and none == []
    assert tensor_parallel_wedge(1, [0], ps_text=PS, main_pid=100) == ("", [])
    # a rank in a driver call that does not return (D) takes part in no collective either
    (hung,) = stopped_ranks({0: (101, "Sl"), 1: (102, "D")}, [], when="readiness")
    assert hung.sentence().startswith("tensor-parallel rank TP1 (rank 1, pid 102, visible GPU 1) hangs during "
                                      "readiness: in uninterruptible I/O")


def test_tp_size_from_server_info_and_the_command_the_larger_names_the_ranks() -> None:
    assert tp_size_of(["-m", "sglang.launch_server", "--tp", "4"], None) == 4
    assert tp_size_of([], {"tp_size": 8}) == 8
    assert tp_size_of(["--tp-size", "{tp}"], {}) == 1
    # /server_info saying 1 under --tp-size 2 still has two ranks to look at, and the mismatch is said
    assert tp_size_of(["--tp-size", "2"], {"tp_size": 1}) == 2
    assert tp_mismatch(["--tp-size", "2"], {"tp_size": 1}) == "its command sets --tp-size 2, /server_info says tp_size = 1"
    assert tp_mismatch(["--tp-size", "2"], {"tp_size": 2}) == "" == tp_mismatch([], {"tp_size": 1})
    assert last_rank_lines(TP_LOG)["TP1"] == "[2026-12-04 21:29:48 TP1] Init torch distributed begin."
