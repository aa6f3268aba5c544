"""Tensor-parallel ranks as a failure names them: which GPU a rank runs on, what the log says of each rank.

SGLang 0.5.17 runs one scheduler process per rank (`sglang::scheduler_TP{i}`), rank i on visible GPU
`base_gpu_id + i` (the i-th GPU of the service's `gpus` list, its CUDA_VISIBLE_DEVICES); its lines carry
` TP{i}` in their time stamp. When one dies, SGLang's subprocess watchdog (`utils/watchdog.py`) logs
`Subprocess scheduler_{i} (pid=N) crashed with exit code C. Triggering SIGQUIT for cleanup...`; when one
fails at start-up its own traceback is prefixed ` TP{i}`. These functions make one `RankFault` per rank (its
pid, its GPU, what happened and when), which the errors carry and the diagnosis and the verdict name.
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_dflash.errors import DflashError, RankFault
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.services.base import LaunchesOnHost, LogMark, ServiceManager
from pytest_dflash.services.phases import STAMP
from pytest_dflash.services.served import command_of, served_config

__all__ = ["RankWatch", "last_rank_lines", "rank_faults_in_log", "rank_gpu", "rank_on_gpu", "rank_processes",
           "rank_watch", "stopped_ranks", "tensor_parallel_wedge", "tp_mismatch", "tp_size_of",
           "wedge_at_tp"]

_CHILD_DIED = re.compile(r"Subprocess scheduler_(\d+) \(pid=(\d+)\) crashed with exit code (-?\d+)")
# a rank's own traceback: its time stamp (phases.STAMP: the time, then its " DP{d} PP{p} TP{t}" label) first
_RANK_FAILED = re.compile(STAMP.pattern + r"Scheduler hit an exception")
_RANK_ERROR = re.compile(r"^(\w+(?:Error|Exception)): (.+)$", re.MULTILINE)


def rank_gpu(rank: int, gpus: Sequence[int]) -> str:
    """'GPU 5' from the service's `gpus` [4, 5]; 'visible GPU 1' where the profile lists none."""
    return f"GPU {gpus[rank]}" if rank < len(gpus) else f"visible GPU {rank}"


def rank_on_gpu(label: str, gpus: Sequence[int]) -> str:
    """'TP1 (GPU 5)' from the service's `gpus` [4, 5]; 'TP1 (visible GPU 1)' where the profile lists none."""
    match = re.search(r"TP(\d+)", label)
    if match is None:
        return label
    return f"{label} ({rank_gpu(int(match.group(1)), gpus)})"


def _exit_how(code: int) -> str:
    """SGLang's watchdog exit code in words: -9 'killed by SIGKILL', -11 'killed by SIGSEGV', 1 'exit code
    1'."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def rank_faults_in_log(log: str, gpus: Sequence[int], *, when: str = "") -> list[RankFault]:
    """Each rank the log says failed: a child the subprocess watchdog saw die (its rank, pid, how), or a rank
    whose start-up hit an exception (its label and the exception). `when`: the phase the caller saw it in."""
    out: dict[int, RankFault] = {}
    for match in _CHILD_DIED.finditer(log):
        rank, pid, code = int(match.group(1)), int(match.group(2)), int(match.group(3))
        out.setdefault(rank, RankFault(rank, "died", _exit_how(code), pid, rank_gpu(rank, gpus), when=when))
    for match in _RANK_FAILED.finditer(log):
        label = re.search(r"TP(\d+)", match.group(2))
        if label is None:
            continue
        rank = int(label.group(1))
        error = _RANK_ERROR.search(log, match.end())
        how = f"{error.group(1)}: {error.group(2)[:200]}" if error else ""
        # a start-up exception says more than the watchdog's exit code that follows it
        died = out.get(rank)
        out[rank] = RankFault(rank, "failed", how, died.pid if died else None, rank_gpu(rank, gpus),
                              when="start-up")
    return [out[rank] for rank in sorted(out)]


_PS_LINE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)$")
_RANK_TITLE = re.compile(r"^sglang::scheduler((?:_(?:DP|PP)\d+)*)_TP(\d+)\b")
# ps state -> (what a rank in it did, how): a rank in one of these takes part in no collective
_STATES = {"T": ("stopped", "SIGSTOP or a debugger"), "t": ("stopped", "by a tracer"),
           "D": ("hangs", "in uninterruptible I/O (a GPU driver call that does not return)"),
           "Z": ("died", "a zombie (dead, not reaped)")}


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


def stopped_ranks(processes: Mapping[int, tuple[int, str]], gpus: Sequence[int], *,
                  when: str = "") -> list[RankFault]:
    """The rank processes (`rank_processes`) that cannot take part in a collective: stopped, traced, in
    uninterruptible I/O, or zombies."""
    out = []
    for rank, (pid, stat) in sorted(processes.items()):
        if stat[:1] in _STATES:
            event, how = _STATES[stat[:1]]
            out.append(RankFault(rank, event, f"{how} (process state {stat[:1]})", pid, rank_gpu(rank, gpus),
                                 when=when))
    return out


def tensor_parallel_wedge(tp_size: int, gpus: Sequence[int], *, ps_text: str = "",
                          main_pid: int | None = None, log: str = "",
                          when: str = "serving") -> tuple[str, list[RankFault]]:
    """For a stuck engine at TP > 1: that it is tensor-parallel, the rank whose process is stopped (with its
    pid and GPU, also as `RankFault`s) or whose log went quiet; ('', []) on one GPU."""
    if tp_size < 2:
        return "", []
    parts = [f"the engine is tensor-parallel (--tp-size {tp_size}: one stopped rank holds every collective)"]
    processes = rank_processes(ps_text, main_pid) if ps_text else {}
    faults = stopped_ranks(processes, gpus, when=when)
    parts += [f"{fault.sentence()} (sglang::scheduler_TP{fault.rank})" for fault in faults]
    if processes and not faults:
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
    return "; ".join(parts), faults


def tp_size_of(argv: Sequence[str], server_info: Mapping[str, Any] | None) -> int:
    """The service's tensor parallelism, for naming its ranks: the larger of what /server_info says runs and
    what its launch command asks for (services/served.py; a server_info that says 1 under --tp-size 2 still
    has two ranks to look at)."""
    setting = served_config(argv, server_info).tp_size
    sizes = [value for value in (setting.value, setting.command)
             if isinstance(value, int) and not isinstance(value, bool) and value > 0]
    return max(sizes, default=1)


def tp_mismatch(argv: Sequence[str], server_info: Mapping[str, Any] | None) -> str:
    """'its command sets --tp-size 2, /server_info says tp_size = 1' where the two disagree, else ''."""
    return served_config(argv, server_info).tp_size.contradiction() or ""


def _rank_ps(manager: ServiceManager, transport: Transport | None) -> tuple[str, int | None]:
    """One `ps` of the host (read-only, bounded) and the server's main pid; ('', None) where none can be
    read."""
    ps_text, main_pid = "", None
    if transport is not None:
        with contextlib.suppress(DflashError):
            main_pid = manager.state().pid
            result = transport.run("ps -eo pid=,ppid=,stat=,args=", timeout_s=10)
            ps_text = result.stdout if result.ok else ""
    return ps_text, main_pid


def _argv(manager: ServiceManager) -> Sequence[str]:
    argv = manager.launch_environment(live=True).argv if isinstance(manager, LaunchesOnHost) else ()
    return argv or command_of(manager.spec)  # attached by URL, a container: the profile's command, if any


def wedge_at_tp(manager: ServiceManager, transport: Transport | None, *,
                server_info: Mapping[str, Any] | None, gpus: Sequence[int], since: LogMark | None,
                log_lines: int) -> tuple[str, list[RankFault]]:
    """`tensor_parallel_wedge` for a service found stuck while serving: its rank processes read with one `ps`
    on its host and its log since it started; ('', []) on one GPU or where nothing can be read."""
    argv = _argv(manager)
    tp = tp_size_of(argv, server_info)
    if tp < 2:
        return "", []
    ps_text, main_pid = _rank_ps(manager, transport)
    log = ""
    with contextlib.suppress(DflashError):
        log = manager.logs_since(since, log_lines)
    text, faults = tensor_parallel_wedge(tp, gpus, ps_text=ps_text, main_pid=main_pid, log=log)
    mismatch = tp_mismatch(argv, server_info)
    return (f"{mismatch}; {text}" if mismatch else text), faults  # the contradiction first


@dataclass
class RankWatch:
    """A tensor-parallel service's rank processes, read during readiness every `every_s`: a rank found unable
    to take part in a collective (stopped, traced, in uninterruptible I/O) at two reads in a row ends the wait
    naming it, where a cold JIT would only look the same from HTTP (a request accepted, not answered)."""

    manager: ServiceManager
    transport: Transport
    gpus: Sequence[int]
    every_s: float = 2.0
    _next_at: float = 0.0
    _seen: frozenset[int] = frozenset()

    def stopped(self, now: float, *, when: str = "readiness") -> list[RankFault]:
        """The ranks stopped at this read and the one before; [] between reads."""
        if now < self._next_at:
            return []
        self._next_at = now + self.every_s
        ps_text, main_pid = _rank_ps(self.manager, self.transport)
        faults = stopped_ranks(rank_processes(ps_text, main_pid), self.gpus, when=when) if ps_text else []
        seen, self._seen = self._seen, frozenset(f.rank for f in faults)
        return [fault for fault in faults if fault.rank in seen]


def rank_watch(manager: ServiceManager, transport: Transport | None, gpus: Sequence[int]) -> RankWatch | None:
    """A `RankWatch` for a service whose command runs more than one rank on a host this run can read; None
    otherwise."""
    if transport is None or tp_size_of(_argv(manager), None) < 2:
        return None
    return RankWatch(manager, transport, gpus)
