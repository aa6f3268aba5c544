"""services/phases.py: a cold start by phase from SGLang 0.5.17's own log lines, on real logs recorded on an H200."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from pytest_dflash.services.phases import (
    describe_in_progress,
    parse_startup,
    phase_offsets,
    to_unix,
    utc_offset_for,
)

DATA = Path(__file__).parents[1] / "data"
H200 = DATA / "sglang-0.5.17-h200" / "logs"
DEC02 = DATA / "sglang-0.5.17-h200-2026-12-02"
DDTREE = DATA / "sglang-0.5.17-h200-ddtree"


def day(path: Path) -> str:
    return path.read_text(errors="replace")


@pytest.mark.parametrize(("log", "ends"), [
    # plain on a fresh H200 (the example): weights, pool and port in one second, no CUDA graphs
    (DEC02 / "ngram-host.plain.server.log",
     {"process_started": "21:46:35", "weights_loaded": "21:47:08", "kv_cache_allocated": "21:47:08",
      "port_open": "21:47:08"}),
    # NGRAM started after it: its pool took 11 s after its weights
    (DEC02 / "ngram.server.log",
     {"process_started": "21:50:30", "weights_loaded": "21:50:57", "kv_cache_allocated": "21:51:08",
      "port_open": "21:51:08"}),
    # DFLASH with CUDA graphs: a target and a draft pool, then 48 s of capture before the port
    (H200 / "server_dflash_graph.log",
     {"process_started": "02:40:46", "weights_loaded": "02:41:16", "kv_cache_allocated": "02:41:17",
      "cuda_graphs_captured": "02:42:05", "port_open": "02:42:05"}),
    # DFLASH without graphs
    (H200 / "server_dflash_nograph.log",
     {"process_started": "02:24:17", "weights_loaded": "02:24:51", "kv_cache_allocated": "02:24:52",
      "port_open": "02:24:53"}),
    # DDTREE (the ddtree-v2 overlay) with graphs: 87 s of capture
    (DDTREE / "run2-configs" / "server_ddtree_graphs.log",
     {"process_started": "14:30:45", "weights_loaded": "14:31:17", "kv_cache_allocated": "14:31:17",
      "cuda_graphs_captured": "14:32:44", "port_open": "14:32:45"}),
])
def test_the_phases_of_real_sglang_start_ups(log: Path, ends: dict[str, str]) -> None:
    parsed = parse_startup(day(log))
    assert {name: stamp.strftime("%H:%M:%S") for name, stamp in parsed.ends.items()} == ends
    assert list(parsed.ends) == list(ends)  # in start-up order
    assert parsed.memory_settled


def test_a_start_up_that_died_before_its_pools_never_settled() -> None:
    """S4e: a neighbour allocated during its start-up; the scheduler died before any pool line."""
    parsed = parse_startup(day(H200 / "S4e_neighbour_allocates_during_startup.log"))
    assert list(parsed.ends) == ["process_started"]
    assert not parsed.memory_settled


def test_the_pools_are_settled_only_once_their_run_of_lines_is_over() -> None:
    """DFLASH allocates a target and a draft pool: after the first pool line its memory is not settled yet."""
    lines = day(H200 / "server_dflash_graph.log").splitlines()
    first_pool = next(i for i, line in enumerate(lines) if "KV Cache is allocated" in line)
    for cut in range(first_pool + 1, first_pool + 5):  # target pool, its end, draft pool, its end
        assert not parse_startup("\n".join(lines[:cut])).memory_settled, lines[cut - 1]
    settled = parse_startup("\n".join(lines[:first_pool + 5]))  # "Overriding draft attention backend …"
    assert settled.memory_settled and settled.ends["kv_cache_allocated"].strftime("%H:%M:%S") == "02:41:17"
    assert "cuda_graphs_captured" not in settled.ends


def test_a_log_cut_during_the_cuda_graph_capture_says_so() -> None:
    lines = day(H200 / "server_dflash_graph.log").splitlines()
    cut = next(i for i, line in enumerate(lines) if "Capture target prefill CUDA graph begin" in line) + 1
    parsed = parse_startup("\n".join(lines[:cut]))
    waited_from = to_unix(dt.datetime(2026, 11, 30, 2, 40, 46), 0.0)
    now = to_unix(dt.datetime(2026, 11, 30, 2, 41, 57), 0.0)  # 40 s into the capture
    said = describe_in_progress(parsed, now=now, waited_from=waited_from, utc_offset_s=0.0)
    assert said == "in CUDA-graph capture for 40.0s (KV cache allocated at 31.0s)", said


@pytest.mark.parametrize(("last", "said"), [
    # NGRAM of 2026-12-02: 11 s between its weights and its pool lines (SGLang sizes and allocates the pool)
    ("Load weight end.", "allocating the KV cache for 5.00s (weights loaded at 27.0s)"),
    # no CUDA graphs: the scheduler's last lines, the port not open yet
    ("Engine startup timings", "scheduler set up, port not open yet (KV cache allocated at 38.0s)"),
])
def test_what_a_start_up_without_graphs_is_doing(last: str, said: str) -> None:
    lines = day(DEC02 / "ngram.server.log").splitlines()
    cut = next(i for i, line in enumerate(lines) if last in line) + 1
    parsed = parse_startup("\n".join(lines[:cut]))
    waited_from = to_unix(dt.datetime(2026, 12, 2, 21, 50, 30), 0.0)
    now = to_unix(parsed.last_line or dt.datetime(2026, 12, 2), 0.0) + 5
    assert describe_in_progress(parsed, now=now, waited_from=waited_from, utc_offset_s=0.0) == said


def test_journald_and_container_prefixes_are_read_through() -> None:
    text = ("Dec 02 21:46:35 h200 python[737]: [2026-12-02 21:46:35] server_args=ServerArgs(...)\n"
            "2026-12-02T21:47:08.1Z [2026-12-02 21:47:08] KV Cache is allocated. dtype: torch.bfloat16\n"
            "2026-12-02T21:47:08.1Z [2026-12-02 21:47:08] Memory pool end. avail mem=97.20 GB\n"
            "2026-12-02T21:47:08.2Z [2026-12-02 21:47:09] INFO:     Uvicorn running on http://127.0.0.1:1 (Press)\n")
    assert [s.strftime("%S") for s in parse_startup(text).ends.values()] == ["35", "08", "09"]


def test_phases_become_seconds_from_the_start_of_the_wait() -> None:
    parsed = parse_startup(day(DEC02 / "ngram-host.plain.server.log"))
    # the log's clock is UTC+1 (no zone in the log): a line read 3 s after it was written tells the offset
    read_at = to_unix(dt.datetime(2026, 12, 2, 20, 46, 38), 0.0)
    offset = utc_offset_for(dt.datetime(2026, 12, 2, 21, 46, 35), seen_at=read_at)
    assert offset == 3600
    waited_from = to_unix(dt.datetime(2026, 12, 2, 21, 46, 30), 3600)  # started 5 s before its first line
    offsets = phase_offsets(parsed, waited_from=waited_from, utc_offset_s=offset, not_after=34.0)
    assert offsets == {"process_started": 5.0, "weights_loaded": 34.0, "kv_cache_allocated": 34.0,
                       "port_open": 34.0}
    # a line cannot end a phase after the moment it was read (HTTP saw the port at 33.5 s)
    assert phase_offsets(parsed, waited_from=waited_from, utc_offset_s=offset, not_after=33.5)["port_open"] == 33.5


OVERLAP = DATA / "sglang-0.5.17-h200-overlap"


def test_the_recorded_h200_overlap_started_the_neighbour_at_the_kv_line() -> None:
    """Issue 26 on real SGLang (plain with CUDA graphs + NGRAM on one H200, cold caches): the phases the verdict
    recorded are the ones its server logs say, and NGRAM started within 3 s of plain's `KV Cache is allocated`
    line — during plain's CUDA-graph capture, long before its readiness — and both became ready."""
    import json

    verdict = json.loads((OVERLAP / "cold.verdict.json").read_text())
    plain, ngram = verdict["services"]["plain"]["ready"], verdict["services"]["ngram"]["ready"]
    for name, ready in (("plain", plain), ("ngram", ngram)):
        log = parse_startup(day(OVERLAP / f"cold.{name}.server.log"))
        recorded = {phase: seconds for phase, seconds in ready["phases"].items() if not phase.startswith("first_")}
        # the machine's clock was UTC: the log's stamps are the verdict's phases to the second
        assert phase_offsets(log, waited_from=ready["waited_from"], utc_offset_s=0.0) == pytest.approx(recorded, abs=1)
    plain_kv_at = plain["waited_from"] + plain["phases"]["kv_cache_allocated"]
    assert 0 <= ngram["waited_from"] - plain_kv_at < 3
    assert ngram["waited_from"] < plain["waited_from"] + plain["phases"]["cuda_graphs_captured"]
    assert ngram["ready_at"] - plain["waited_from"] < plain["total_s"] + 5  # overlapped: not plain's + ngram's
