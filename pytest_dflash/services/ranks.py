"""Tensor-parallel ranks as a failure names them: which GPU a rank runs on, what the log says of each rank.

SGLang 0.5.17 runs one scheduler process per rank (`sglang::scheduler_TP{i}`), rank i on visible GPU
`base_gpu_id + i` (the i-th GPU of the service's `gpus` list, its CUDA_VISIBLE_DEVICES); its lines carry
` TP{i}` in their time stamp. When one dies, SGLang's subprocess watchdog (`utils/watchdog.py`) logs
`Subprocess scheduler_{i} (pid=N) crashed with exit code C. Triggering SIGQUIT for cleanup...`; when one
fails at start-up its own traceback is prefixed ` TP{i}`. These functions make one sentence per rank.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_dflash.errors import DflashError
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.services.base import LaunchesOnHost, LogMark, ServiceManager
from pytest_dflash.services.phases import STAMP
from pytest_dflash.services.served import command_of, served_config

__all__ = ["last_rank_lines", "rank_on_gpu", "rank_processes", "ranks_named_in_log", "tensor_parallel_wedge",
           "tp_size_of", "wedge_at_tp"]

_CHILD_DIED = re.compile(r"Subprocess scheduler_(\d+) \(pid=(\d+)\) crashed with exit code (-?\d+)")
# a rank's own traceback: its time stamp (phases.STAMP: the time, then its " DP{d} PP{p} TP{t}" label) first
_RANK_FAILED = re.compile(STAMP.pattern + r"Scheduler hit an exception")
_RANK_ERROR = re.compile(r"^(\w+(?:Error|Exception)): (.+)$", re.MULTILINE)


def rank_on_gpu(label: str, gpus: Sequence[int]) -> str:
    """'TP1 (GPU 5)' from the service's `gpus` [4, 5]; 'TP1 (visible GPU 1)' where the profile lists none."""
    match = re.search(r"TP(\d+)", label)
    if match is None:
        return label
    rank = int(match.group(1))
    where = f"GPU {gpus[rank]}" if rank < len(gpus) else f"visible GPU {rank}"
    return f"{label} ({where})"


def ranks_named_in_log(log: str, gpus: Sequence[int]) -> list[str]:
    """One line per rank the log says failed: its rank, pid, exit code and GPU, or its start-up exception."""
    out = []
    for match in _CHILD_DIED.finditer(log):
        rank, pid, code = match.groups()
        how = "killed by SIGKILL (OOM killer, Xid or an operator)" if code == "-9" else f"exit code {code}"
        out.append(f"tensor-parallel rank {rank_on_gpu(f'TP{rank}', gpus)} died: scheduler_{rank} pid {pid}, "
                   f"{how}")
    for match in _RANK_FAILED.finditer(log):
        label = match.group(2).strip()
        if "TP" not in label:
            continue
        error = _RANK_ERROR.search(log, match.end())
        why = f": {error.group(1)}: {error.group(2)[:200]}" if error else ""
        out.append(f"tensor-parallel rank {rank_on_gpu(label, gpus)} failed at start-up{why}")
    return list(dict.fromkeys(out))


_PS_LINE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)$")
_RANK_TITLE = re.compile(r"^sglang::scheduler((?:_(?:DP|PP)\d+)*)_TP(\d+)\b")
_STATES = {"T": "stopped (SIGSTOP or a debugger)", "t": "stopped by a tracer",
           "D": "in uninterruptible I/O (a GPU driver call that does not return)",
           "Z": "a zombie (dead, not reaped)"}


def rank_processes(ps_text: str, main_pid: int | None) -> dict[int, tuple[int, str]]:
    """TP rank -> (pid, ps state) of the `sglang::scheduler_TP{i}` processes below `main_pid` (all of them
    when it is None), read from `ps -eo pid=,ppid=,stat=,args=`."""
    parents: dict[int, int] = {}
    ranks: dict[int, tuple[int, str]] = {}
    titled: list[tuple[int, int, str]] = []
    for line in ps_text.splitlines():
        match = _PS_LINE.match(line)
        if match is None:
            continue
        pid, ppid, stat, args = int(match.group(1)), int(match.group(2)), match.group(3), match.group(4)
        parents[pid] = ppid
        title = _RANK_TITLE.match(args)
        if title is not None:
            titled.append((int(title.group(2)), pid, stat))

    def below(pid: int) -> bool:
        seen = 0
        while pid in parents and seen < 64:
            if pid == main_pid:
                return True
            pid, seen = parents[pid], seen + 1
        return pid == main_pid

    for rank, pid, stat in titled:
        if main_pid is None or below(pid):
            ranks[rank] = (pid, stat)
    return ranks


def last_rank_lines(log: str) -> dict[str, str]:
    """Each rank label's last timestamped line ('TP1' -> '[2026-12-04 21:29:48 TP1] ...')."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        match = STAMP.search(line)
        label = match.group(2).strip() if match else ""
        if "TP" in label:
            out[label] = line.strip()[:200]
    return out


def tensor_parallel_wedge(tp_size: int, gpus: Sequence[int], *, ps_text: str = "",
                          main_pid: int | None = None, log: str = "") -> str:
    """For a stuck engine at TP > 1: that it is tensor-parallel, the rank whose process is stopped or whose
    log went quiet, with its pid and GPU; '' on one GPU."""
    if tp_size < 2:
        return ""
    parts = [f"the engine is tensor-parallel (--tp-size {tp_size}: one stopped rank holds every collective)"]
    processes = rank_processes(ps_text, main_pid) if ps_text else {}
    odd = {rank: (pid, stat) for rank, (pid, stat) in processes.items() if stat[:1] in _STATES}
    for rank, (pid, stat) in sorted(odd.items()):
        parts.append(f"rank {rank_on_gpu(f'TP{rank}', gpus)} (sglang::scheduler_TP{rank}, pid {pid}) is "
                     f"{_STATES[stat[:1]]}")
    if processes and not odd:
        states = ", ".join(f"TP{r}={s}" for r, (_, s) in sorted(processes.items()))
        parts.append(f"every rank process is running (state {states}): a collective or a GPU that stopped "
                     "answering")
    elif not processes and ps_text:
        parts.append("no sglang::scheduler_TP* process was found below the server")
    lines = last_rank_lines(log)
    if lines:
        quiet = sorted(lines.items(), key=lambda item: item[1])[0]
        parts.append(f"the rank whose log went quiet first: {rank_on_gpu(quiet[0], gpus)}, last line "
                     f"{quiet[1]}")
    return "; ".join(parts)


def tp_size_of(argv: Sequence[str], server_info: Mapping[str, Any] | None) -> int:
    """The service's tensor parallelism: /server_info's tp_size (what runs), else its launch command's
    (services/served.py), else 1."""
    setting = served_config(argv, server_info).tp_size
    for value in (setting.value, setting.command):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 1


def wedge_at_tp(manager: ServiceManager, transport: Transport | None, *,
                server_info: Mapping[str, Any] | None, gpus: Sequence[int], since: LogMark | None,
                log_lines: int) -> str:
    """`tensor_parallel_wedge` for a service found stuck: its rank processes read with one `ps` on its host
    (read-only, bounded) and its log since it started; '' on one GPU or where nothing can be read."""
    argv = manager.launch_environment(live=True).argv if isinstance(manager, LaunchesOnHost) else ()
    argv = argv or command_of(manager.spec)  # attached by URL, a container: the profile's command, if any
    tp = tp_size_of(argv, server_info)
    # /server_info's size names the ranks (what runs); a command that says otherwise is said first
    contradiction = served_config(argv, server_info).tp_size.contradiction()
    if tp < 2:
        return f"{contradiction}: by /server_info one rank, none to name" if contradiction else ""
    ps_text, main_pid = "", None
    if transport is not None:
        with contextlib.suppress(DflashError):
            main_pid = manager.state().pid
            result = transport.run("ps -eo pid=,ppid=,stat=,args=", timeout_s=10)
            ps_text = result.stdout if result.ok else ""
    log = ""
    with contextlib.suppress(DflashError):
        log = manager.logs_since(since, log_lines)
    wedge = tensor_parallel_wedge(tp, gpus, ps_text=ps_text, main_pid=main_pid, log=log)
    return f"{contradiction}; {wedge}" if contradiction else wedge
