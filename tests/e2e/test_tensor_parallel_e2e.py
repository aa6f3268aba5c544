"""`pytest --host local-tp suites/smoke` (refservers at --tp-size 2: two real rank processes each) passes, and
each rank fault fails it naming the rank and its GPU, within the budgets docs/profiles.md documents."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e_helpers import ROOT
from support.pytest_runs import assert_no_crash, verdict

LOCAL_TP = ROOT / "hosts" / "local-tp.toml"


def _faulty(tmp_path: Path, fault: str, *, nccl_init_timeout: str = "20s") -> Path:
    """hosts/local-tp.toml with `fault` injected into its DFLASH service (the plain one stays healthy)."""
    text = LOCAL_TP.read_text()
    marker = '"--tp-size", "2",\n           "--enable-metrics"'
    assert marker in text
    text = text.replace(marker, f'"--tp-size", "2", "--inject", "{fault}",\n           "--enable-metrics"')
    text = text.replace('nccl_init_timeout = "20s"', f'nccl_init_timeout = "{nccl_init_timeout}"')
    path = tmp_path / "local-tp.toml"
    path.write_text(text.replace('name = "local-tp"', 'name = "tp"'))
    return path


def _dflash_failure(run_suite, result: pytest.RunResult) -> str:  # type: ignore[no-untyped-def]
    data = verdict(run_suite.reports, "tp")
    assert data["verdict"] == "fail"
    failures = [f for f in data["failures"] if "dflash" in f.get("services", [])]
    assert failures, json.dumps(data["failures"])[:2000]
    assert not [f for f in data["failures"] if "none" in f.get("services", [])]  # the healthy service passes
    return json.dumps(data) + result.stdout.str()


def test_local_tp_smoke_passes(run_suite) -> None:  # type: ignore[no-untyped-def]
    result = run_suite("smoke", "--host", str(LOCAL_TP))
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert verdict(run_suite.reports, "local-tp")["verdict"] == "pass"


def test_a_rank_killed_while_serving_is_named_with_its_pid_and_gpu(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_suite("smoke", "--host", str(_faulty(tmp_path, "rank-crash=1@3")))
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    assert "tensor-parallel rank TP1 (visible GPU 1) died: scheduler_1 pid" in text
    assert "killed by SIGKILL" in text


def test_a_rank_without_kv_cache_memory_fails_start_up_naming_it(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_suite("smoke", "--host", str(_faulty(tmp_path, "rank-oom=1")))
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    assert "tensor-parallel rank TP1 (visible GPU 1) failed at start-up: RuntimeError: Not enough memory" in text
    assert "kv-cache-not-enough-memory" in text


def test_nccl_init_that_never_ends_fails_at_its_budget_not_at_ready_timeout(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    result = run_suite("smoke", "--host", str(_faulty(tmp_path, "nccl-init-hang", nccl_init_timeout="4s")))
    took = time.monotonic() - started
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    assert "TP0 (visible GPU 0), TP1 (visible GPU 1) stuck in NCCL init" in text
    assert "past nccl_init_timeout 4.00s" in text
    assert "nccl-init-stuck" in text
    assert took < 50  # ready_timeout is 60 s: the budget ended it, not readiness


def test_a_stopped_rank_is_engine_stuck_naming_the_rank(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """rank-hang=1@3: the rank stops (SIGSTOP) on the first request after readiness; the request runs out of
    --request-timeout (20 s here) and the stuck check names the tensor-parallel engine and the stopped rank."""
    result = run_suite("smoke", "--host", str(_faulty(tmp_path, "rank-hang=1@3")))
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    assert "engine-stuck" in text and "the engine is tensor-parallel (--tp-size 2" in text
    assert "rank TP1 (visible GPU 1) (sglang::scheduler_TP1, pid" in text and "is stopped" in text
