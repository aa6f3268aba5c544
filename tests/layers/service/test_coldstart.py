"""layers/service/coldstart.py: cold-start budgets ([floors.SERVICE] cold_start_s, <phase>_s) against the phases of
real H200 start-ups (services/phases.py on the recorded logs), and one real run of suites/service that fails a
refserver whose CUDA-graph capture (the slow-graphs fault) is over its budget while a quick one passes."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import pytest

from pytest_dflash.config.tables.floors import COLD_START_FLOORS
from pytest_dflash.layers.service.coldstart import judge_cold_start, phase_durations
from pytest_dflash.services.phases import PHASE_NAMES, parse_startup, phase_offsets, to_unix

DATA = Path(__file__).parents[2] / "data"


def dflash_graphs() -> dict[str, float]:
    """DFLASH with CUDA graphs on the H200 (2026-11-30), as if the wait began at 02:40:45; greedy/sampled made up."""
    parsed = parse_startup((DATA / "sglang-0.5.17-h200" / "logs" / "server_dflash_graph.log").read_text())
    waited_from = to_unix(dt.datetime(2026, 11, 30, 2, 40, 45), 0.0)
    return {**phase_offsets(parsed, waited_from=waited_from, utc_offset_s=0.0), "first_greedy": 81.0,
            "first_sampled": 170.0}


def test_the_floor_keys_are_the_phases() -> None:
    assert ("cold_start_s", *(f"{name}_s" for name in PHASE_NAMES)) == COLD_START_FLOORS


def test_phase_durations_of_a_real_start_up() -> None:
    assert phase_durations(dflash_graphs()) == {
        "process_started": 1.0, "weights_loaded": 30.0, "kv_cache_allocated": 1.0, "cuda_graphs_captured": 48.0,
        "port_open": 0.0, "first_greedy": 1.0, "first_sampled": 89.0}


def test_budgets_that_hold_pass_and_those_broken_are_named() -> None:
    phases = dflash_graphs()
    assert judge_cold_start(phases, {"cold_start_s": 180, "cuda_graphs_captured_s": 60, "weights_loaded_s": 40}) == []
    problems = judge_cold_start(phases, {"cold_start_s": 120, "cuda_graphs_captured_s": 30, "speedup": 2.0})
    assert problems == [
        "cold start took 170.0s (until the first sampled answer), budget cold_start_s = 120",
        "phase cuda_graphs_captured took 48.0s (ended at 80.0s), budget cuda_graphs_captured_s = 30"]


def test_a_budget_on_a_phase_the_start_up_did_not_show_is_not_a_pass() -> None:
    """The plain server of 2026-12-02 ran without CUDA graphs: a capture budget cannot be judged on it."""
    parsed = parse_startup((DATA / "sglang-0.5.17-h200-2026-12-02" / "ngram-host.plain.server.log").read_text())
    phases = phase_offsets(parsed, waited_from=to_unix(dt.datetime(2026, 12, 2, 21, 46, 34), 0.0), utc_offset_s=0)
    (problem,) = judge_cold_start(phases, {"cuda_graphs_captured_s": 90})
    assert "showed no 'cuda_graphs_captured' phase" in problem


def write_profile(directory: Path, services: dict[str, list[str]], extra: str) -> Path:
    """A local host of refserver processes: {service: extra refserver args}."""
    lines = ["[host]", 'connection = "local://"', f'python = "{sys.executable}"', 'provision = "always"', ""]
    for name, args in services.items():
        command = ["{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
                   "--speculative-algorithm", "NONE", *args]
        lines += [f"[services.{name}]", 'kind = "process"', 'algorithm = "NONE"', f"command = {json.dumps(command)}",
                  'ready_timeout = "60s"', ""]
    path = directory / "budgets.toml"
    path.write_text("\n".join(lines) + extra)
    return path


def test_the_service_suite_fails_a_start_up_over_its_budget(pytester: pytest.Pytester, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_STATE_DIR", str(tmp_path / "state"))
    extra = "\n[floors.slow]\ncuda_graphs_captured_s = 1\n\n[floors.quick]\ncold_start_s = 60\nport_open_s = 30\n"
    profile = write_profile(tmp_path, {"slow": ["--inject", "slow-graphs=3"], "quick": [], "free": []}, extra)
    suite = Path(__file__).parents[3] / "suites" / "service" / "test_service.py"
    result = pytester.runpytest_subprocess(str(suite), "-p", "no:cacheprovider", "--host", str(profile),
                                           "-k", "cold_start", f"--dflash-report={tmp_path / 'reports'}", "-rs")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*budgets/slow: cold start over budget: phase cuda_graphs_captured took 3.*s*"
                                 "budget cuda_graphs_captured_s = 1*",
                                 "*budgets/free: no cold-start budget*"])
    verdict = json.loads(next((tmp_path / "reports").glob("*.json")).read_text())
    assert "phases" in json.dumps(verdict)
