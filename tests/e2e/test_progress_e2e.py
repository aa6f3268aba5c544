"""Progress you can see (report/progress.py): real pytest runs of the perf suite against real refservers.

With ``-n 2`` the workers' readiness heartbeats, perf "so far" lines and the fleet counts reach the controller's
terminal; with ``-q -n 2`` only the event lines do; without ``-n`` the lines appear as before (plain lines: the
pytester subprocess has no terminal). ``cold-jit=6`` holds readiness for ~15 s: one heartbeat at 10 s.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from e2e_helpers import write_profile
from support.pytest_runs import assert_no_crash

from pytest_dflash.config.paths import state_root

COLD = ["--gpu-step-ms", "8", "--inject", "cold-jit=6"]


def perf_table(duration_s: int) -> str:
    # retries = 0: a busy CI machine's saturated client must not double the run
    return (f'[perf]\nendpoint = "generate"\nconcurrency = 2\nrequests = 100000\nduration = "{duration_s}s"\n'
            "warmup = 1\nprompt_len = 16\noutput_len = 16\nmax_loop_lag_ms = 1000\nretries = 0\n")


def progress_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if line.startswith("[dflash] ")]


def left_behind(result: pytest.RunResult) -> list[Path]:
    run_id = re.search(r"dflash: run (\w+);", result.stdout.str())
    assert run_id, result.stdout.str()[-2000:]
    return list((state_root() / "progress").glob(f"{run_id.group(1)}*"))


@pytest.mark.heavy
def test_xdist_workers_progress_reaches_the_controller(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good = write_profile(tmp_path, "prog-good", {"dflash": ("DFLASH", COLD)}, extra=perf_table(11))
    bad = write_profile(tmp_path, "prog-bad", {"dflash": ("DFLASH", ["--inject", "flashinfer-sm120=1"])},
                        extra=perf_table(2))
    result = run_suite("perf", "--host", str(good), "--host", str(bad), "-n", "2", "-k", "throughput")
    assert_no_crash(result)
    lines = progress_lines(result)
    text = "\n".join(lines)
    assert "[dflash] prog-good/dflash: started (http://127.0.0.1:" in text, result.stdout.str()[-4000:]
    assert re.search(r"\[dflash\] prog-good/dflash: waiting 1\d\.\ds in (greedy|sampled) phase", text), text
    assert "[dflash] prog-good/dflash: ready after" in text, text
    assert "[dflash] prog-bad/dflash: not ready:" in text, text
    assert "[dflash] fleet: 0 of 2 hosts ready, 1 failed, 1 pending" in text, text
    assert "[dflash] fleet: 1 of 2 hosts ready, 1 failed, 0 pending" in text, text
    assert "[dflash] prog-good/dflash: perf run (generate, concurrency 2" in text, text
    assert re.search(r"\[dflash\] prog-good/dflash: perf run so far: \d+ requests \(0 failed\), [\d,]+ tok/s, 1\ds",
                     text), text
    assert re.search(r"\[dflash\] prog-good/dflash \(DFLASH\): [\d.]+ output tok/s", text), text
    assert not left_behind(result)  # the controller removed the run's progress file


def test_quiet_xdist_shows_only_phase_changes(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good = write_profile(tmp_path, "prog-quiet", {"dflash": ("DFLASH", COLD)}, extra=perf_table(2))
    result = run_suite("perf", "--host", str(good), "-n", "2", "-q", "-k", "throughput")
    assert_no_crash(result)
    text = "\n".join(progress_lines(result))
    assert "[dflash] prog-quiet/dflash: started (" in text, result.stdout.str()[-4000:]
    assert "[dflash] prog-quiet/dflash: ready after" in text, text
    assert "[dflash] fleet:" not in text, text  # one host: its service's own lines say it, no fleet count
    assert "[dflash] prog-quiet/dflash: perf run (generate" in text, text
    assert re.search(r"\[dflash\] prog-quiet/dflash \(DFLASH\): [\d.]+ output tok/s", text), text
    assert "waiting" not in text and "so far" not in text, text  # heartbeats: not in -q logs


def test_without_xdist_the_lines_appear_as_before(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good = write_profile(tmp_path, "prog-plain", {"dflash": ("DFLASH", COLD)}, extra=perf_table(2))
    result = run_suite("perf", "--host", str(good), "-k", "throughput")
    assert_no_crash(result)
    text = "\n".join(progress_lines(result))
    assert "[dflash] prog-plain/dflash: started (" in text, result.stdout.str()[-4000:]
    assert re.search(r"\[dflash\] prog-plain/dflash: waiting 1\d\.\ds in (greedy|sampled) phase", text), text
    assert "[dflash] prog-plain/dflash: ready after" in text, text
    assert "[dflash] prog-plain/dflash: perf run (generate" in text, text
    assert re.search(r"\[dflash\] prog-plain/dflash \(DFLASH\): [\d.]+ output tok/s", text), text
