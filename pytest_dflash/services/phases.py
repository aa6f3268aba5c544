"""A cold start by phase, read from SGLang's own log lines (pure functions on log text).

SGLang 0.5.17 prefixes every line with its local wall-clock time to the second, ``[2026-12-02 21:47:08] ``
(under journald or ``podman logs --timestamps`` the line carries that prefix after their own). Its start-up,
in the order it prints it (recorded on an H200: plain, NGRAM, DFLASH and DDTREE, with and without CUDA
graphs):

=====================  ==================================================================================
phase (ends at)        the line
=====================  ==================================================================================
process_started        the first timestamped line (imports done: the process logs)
weights_loaded         the last ``Load weight end.`` before the KV pools (target, then draft)
kv_cache_allocated     the last ``KV Cache is allocated.`` / ``Memory pool end.`` of the run of pool lines
                       (one pair for plain/NGRAM, a target and a draft pair for DFLASH/DDTREE), counted only
                       once a later line that is not a pool line shows that run is over
cuda_graphs_captured   the last ``Capture … CUDA graph end.``, once ``max_total_num_tokens=`` follows
                       (absent where graphs are off: ``Disable prefill CUDA graph …``)
port_open              ``Uvicorn running on http://HOST:PORT``
=====================  ==================================================================================

KV pools come BEFORE the CUDA-graph capture in 0.5.17 (the capture is the long part: up to 185 s recorded),
and the port opens after both. Times become seconds from the start of a readiness wait (a known wall-clock
time, unix seconds) through the log's UTC offset: the log has no zone, so `utc_offset_for` derives it from one
line seen at a known time (rounded to a quarter hour: zones are whole quarter hours, the reading is seconds
late).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

from pytest_dflash.config.durations import format_seconds

__all__ = ["PHASE_NAMES", "RankStartup", "StartupLog", "describe_in_progress", "describe_ranks",
           "nccl_init_stuck", "parse_startup", "phase_offsets", "utc_offset_for"]

# The ordered phases of ReadyReport.phases: the start-up ones from the log, then the readiness generations.
PHASE_NAMES = ("process_started", "weights_loaded", "kv_cache_allocated", "cuda_graphs_captured", "port_open",
               "first_greedy", "first_sampled")
# A scheduler rank's lines carry its place after the time: "[2026-12-04 21:29:48 TP1] " (SGLang's logger
# prefix: " DP{d}" " PP{p}" " TP{t}" as the launch has them); the HTTP process's lines carry none.
STAMP = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})((?: (?:DP|PP|TP|EP)\d+)*)\] ")
_NCCL_BEGIN = re.compile(r"Init torch distributed begin\.")
_NCCL_END = re.compile(r"Init torch distributed ends\.")
_WEIGHTS = re.compile(r"Load weight end\.")
_POOL = re.compile(r"KV Cache is allocated\.|Memory pool end\.")
_GRAPH_BEGIN = re.compile(r"Capture .*cuda graph begin", re.IGNORECASE)
_GRAPH_END = re.compile(r"Capture .*cuda graph end", re.IGNORECASE)
_SCHEDULER_DONE = re.compile(r"max_total_num_tokens=")
_PORT = re.compile(r"Uvicorn running on https?://")
QUARTER_HOUR_S = 900.0


@dataclass
class RankStartup:
    """One scheduler rank's start-up as its prefixed lines show it."""

    label: str  # "TP1", "PP0 TP3", ...
    first_line: dt.datetime
    last_line: dt.datetime
    last_message: str = ""
    nccl_begun: dt.datetime | None = None
    nccl_ended: dt.datetime | None = None

    @property
    def tp_rank(self) -> int | None:
        match = re.search(r"TP(\d+)", self.label)
        return int(match.group(1)) if match else None

    @property
    def in_nccl_init(self) -> bool:
        return self.nccl_begun is not None and self.nccl_ended is None


@dataclass
class StartupLog:
    """What one start-up's log says so far: each phase's end as the log's own (zone-less) time."""

    ends: dict[str, dt.datetime] = field(default_factory=dict)  # phase -> when it ended, in PHASE_NAMES order
    graphs_begun: dt.datetime | None = None  # a CUDA-graph capture is under way (or was) since then
    pools_begun: dt.datetime | None = None  # the first pool line (the run may not be over yet)
    last_line: dt.datetime | None = None  # the latest timestamped line
    weights_end: dt.datetime | None = None  # the latest "Load weight end." before the pools
    # a tensor-parallel launch: each scheduler rank's own start-up ("TP1", "PP0 TP1"), in order of first line
    ranks: dict[str, RankStartup] = field(default_factory=dict)

    @property
    def memory_settled(self) -> bool:
        """True once the KV pools are allocated (a neighbour starting now cannot be charged to them: S4e)."""
        return "kv_cache_allocated" in self.ends or "port_open" in self.ends


def parse_startup(text: str) -> StartupLog:
    """The phases of the FIRST start-up in `text` (a log read since the service was started)."""
    log = StartupLog()
    pool_end: dt.datetime | None = None
    graph_end: dt.datetime | None = None
    weights_end: dt.datetime | None = None
    for line in text.splitlines():
        match = STAMP.search(line)
        if match is None:
            continue  # tracebacks, progress bars, warnings without SGLang's prefix
        stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
        message = line[match.end():]
        log.last_line = stamp
        label = match.group(2).strip()
        if label:
            _rank_line(log, label, stamp, message)
            if any(part[2:] != "0" for part in label.split()):
                continue  # the cold start's phases follow rank 0 (SGLang's TP0), as on one GPU
        ends = log.ends
        if "process_started" not in ends:
            ends["process_started"] = stamp
        if "port_open" in ends:
            break  # the rest is serving (a second start-up would be a restart: readiness fails on that)
        if _POOL.search(message):
            log.pools_begun = log.pools_begun or stamp
            pool_end = stamp
            continue
        if pool_end is not None and "kv_cache_allocated" not in ends:
            # the run of pool lines is over: weights (loaded before the pools) and the pools are settled
            if weights_end is not None:
                ends["weights_loaded"] = weights_end
            ends["kv_cache_allocated"] = pool_end
        if _WEIGHTS.search(message) and "kv_cache_allocated" not in ends:
            weights_end = log.weights_end = stamp
        elif _GRAPH_BEGIN.search(message):
            log.graphs_begun = log.graphs_begun or stamp
        elif _GRAPH_END.search(message):
            graph_end = stamp
        elif _SCHEDULER_DONE.search(message) and graph_end is not None:
            ends["cuda_graphs_captured"] = graph_end
        elif _PORT.search(message):
            if weights_end is not None:
                ends.setdefault("weights_loaded", weights_end)
            if graph_end is not None:
                ends.setdefault("cuda_graphs_captured", graph_end)
            ends["port_open"] = stamp
    log.ends = {name: log.ends[name] for name in PHASE_NAMES if name in log.ends}
    return log


def _rank_line(log: StartupLog, label: str, stamp: dt.datetime, message: str) -> None:
    rank = log.ranks.get(label)
    if rank is None:
        rank = log.ranks[label] = RankStartup(label, stamp, stamp)
    rank.last_line, rank.last_message = stamp, message.strip()[:200]
    if _NCCL_BEGIN.search(message):
        rank.nccl_begun = rank.nccl_begun or stamp
    elif _NCCL_END.search(message):
        rank.nccl_ended = stamp


def nccl_init_stuck(log: StartupLog, *, now: float, utc_offset_s: float,
                    budget_s: float) -> tuple[list[RankStartup], float]:
    """Once one rank has been in NCCL init (`Init torch distributed begin.` without its `ends`) for longer
    than `budget_s` at unix time `now`: every rank still in it, and the longest wait; ([], 0) when
    none is over budget. A rank that began later waits on the same communicator: stuck too, not "past it"."""
    waiting = [r for r in log.ranks.values() if r.in_nccl_init and r.nccl_begun is not None]
    longest = max((now - to_unix(r.nccl_begun, utc_offset_s) for r in waiting if r.nccl_begun is not None),
                  default=0.0)
    if longest <= budget_s:
        return [], 0.0
    waiting.sort(key=lambda r: (r.tp_rank if r.tp_rank is not None else -1, r.label))
    return waiting, longest


def describe_ranks(log: StartupLog, *, now: float, utc_offset_s: float) -> str:
    """A tensor-parallel start-up in one clause: 'TP0..TP3 in NCCL init for 40s', 'TP1 still in NCCL init for
    40s (TP0 done)', or the slowest rank's last step; '' on one GPU."""
    if not log.ranks:
        return ""
    ranks = list(log.ranks.values())
    waiting = [r for r in ranks if r.in_nccl_init]
    if waiting:
        oldest = min(r.nccl_begun for r in waiting if r.nccl_begun is not None)
        names = ", ".join(r.label for r in waiting)
        done = [r.label for r in ranks if r.nccl_ended is not None]
        also = f" ({', '.join(done)} done)" if done else ""
        return (f"{names} in NCCL init for {format_seconds(max(0.0, now - to_unix(oldest, utc_offset_s)))}"
                f"{also}")
    slowest = min(ranks, key=lambda r: r.last_line)
    return (f"slowest rank {slowest.label}: last line "
            f"{format_seconds(max(0.0, now - to_unix(slowest.last_line, utc_offset_s)))} ago "
            f"({slowest.last_message[:80]})")


def utc_offset_for(stamp: dt.datetime, seen_at: float) -> float:
    """The log's UTC offset (seconds, a whole quarter hour): `stamp` is a log time read at unix time
    `seen_at`."""
    naive_utc = stamp.replace(tzinfo=dt.UTC).timestamp()
    return round((naive_utc - seen_at) / QUARTER_HOUR_S) * QUARTER_HOUR_S


def to_unix(stamp: dt.datetime, utc_offset_s: float) -> float:
    """A log time as unix seconds, given the log's UTC offset."""
    return stamp.replace(tzinfo=dt.UTC).timestamp() - utc_offset_s


def phase_offsets(log: StartupLog, *, waited_from: float, utc_offset_s: float,
                  not_after: float | None = None) -> dict[str, float]:
    """Each phase's end in seconds from `waited_from` (unix time), clamped to [0, not_after]: a start-up line
    cannot predate the start, nor come after the moment it was read (`not_after`, seconds from the start)."""
    out: dict[str, float] = {}
    for name, stamp in log.ends.items():
        seconds = max(0.0, to_unix(stamp, utc_offset_s) - waited_from)
        if not_after is not None:
            seconds = min(seconds, not_after)
        out[name] = round(seconds, 3)
    return out


def describe_in_progress(log: StartupLog, *, now: float, waited_from: float, utc_offset_s: float) -> str:
    """What the start-up is doing now (`_describe_phase`), and at TP > 1 its slowest rank."""
    doing = _describe_phase(log, now=now, waited_from=waited_from, utc_offset_s=utc_offset_s)
    if doing and len(log.ranks) > 1 and not any(r.in_nccl_init for r in log.ranks.values()):
        doing += f"; {describe_ranks(log, now=now, utc_offset_s=utc_offset_s)}"
    return doing


def _describe_phase(log: StartupLog, *, now: float, waited_from: float, utc_offset_s: float) -> str:
    """What the start-up is doing now, for a progress line: 'in CUDA-graph capture for 40s (KV cache allocated
    at 12s)'; '' when the log says nothing yet. `now` and `waited_from` are unix times."""
    if not log.ends or "port_open" in log.ends:
        return ""
    ends = log.ends
    if any(r.in_nccl_init for r in log.ranks.values()):
        return describe_ranks(log, now=now, utc_offset_s=utc_offset_s)

    def since(stamp: dt.datetime) -> str:
        return format_seconds(max(0.0, now - to_unix(stamp, utc_offset_s)))

    def at(name: str) -> str:
        return format_seconds(max(0.0, to_unix(ends[name], utc_offset_s) - waited_from))

    if "kv_cache_allocated" in ends:
        if log.graphs_begun is not None and "cuda_graphs_captured" not in ends:
            allocated = at("kv_cache_allocated")
            return f"in CUDA-graph capture for {since(log.graphs_begun)} (KV cache allocated at {allocated})"
        if "cuda_graphs_captured" in ends:
            return (f"scheduler set up, port not open yet (CUDA graphs captured at "
                    f"{at('cuda_graphs_captured')})")
        return f"scheduler set up, port not open yet (KV cache allocated at {at('kv_cache_allocated')})"
    # SGLang prints the pool lines when a pool is done: sizing it takes the time
    if log.weights_end is not None:
        loaded = format_seconds(max(0.0, to_unix(log.weights_end, utc_offset_s) - waited_from))
        return f"allocating the KV cache for {since(log.weights_end)} (weights loaded at {loaded})"
    if log.pools_begun is not None:
        return f"allocating the KV cache for {since(log.pools_begun)}"
    return f"loading (process started at {at('process_started')}, weights and KV cache not allocated yet)"
