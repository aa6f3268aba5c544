"""`pytest --host local-tp suites/smoke` (refservers at --tp-size 2: two real rank processes each) passes, and
each rank fault fails it naming the rank and its GPU, within the budgets docs/profiles.md documents: in the
diagnosis (the failure's first line), the verdict JSON (`services.<svc>.ranks`), JUnit (`dflash.ranks`,
message=), the HTML verdict table and the fleet summary."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from e2e_helpers import ROOT
from junitparser import Failure, JUnitXml, Properties
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


@pytest.mark.heavy
def test_local_tp_smoke_passes(run_suite) -> None:  # type: ignore[no-untyped-def]
    result = run_suite("smoke", "--host", str(LOCAL_TP))
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert verdict(run_suite.reports, "local-tp")["verdict"] == "pass"


def _junit_failure(junit: Path) -> tuple[str, dict[str, str]]:
    """The one failed testcase's message= and its dflash.* properties."""
    for suite in JUnitXml.fromfile(str(junit)):
        for case in suite:
            failed = [r for r in case.result if isinstance(r, Failure)]
            if failed:
                props = {p.name: p.value for ps in case.iterchildren(Properties) for p in ps}
                return failed[0].message or "", props
    raise AssertionError("no failed testcase")


# A rank fault fires in the service or generation layer: the host and env layers before them never touch a service
# (their probes cost ~10 s a run here), parity and perf after them are blocked by the failure. The whole suite's
# pass is test_local_tp_smoke_passes; both services still run, so the healthy one is still seen to pass.
FAULTED = ("-m", "service or generation")
RANK1 = r"tensor-parallel rank TP1 \(rank 1, pid (\d+), visible GPU 1\)"


@pytest.mark.heavy
def test_a_rank_killed_while_serving_is_one_diagnosis_naming_rank_pid_gpu_and_signal(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rank-crash=1@3: rank 1 SIGKILLed while serving; the test sees a dropped connection. Before: 'ApiError …
    connection dropped' first, then [sglang-subprocess-sigkilled] + [connection-dropped], the rank nowhere but the
    progress and BLOCKED lines."""
    monkeypatch.setenv("COLUMNS", "250")  # pytest's short summary cuts its line to the terminal
    junit, page = tmp_path / "junit.xml", tmp_path / "report.html"
    result = run_suite("smoke", *FAULTED, "--host", str(_faulty(tmp_path, "rank-crash=1@3")), f"--junitxml={junit}",
                       f"--html={page}", "-rf")
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    out = result.stdout.str()
    # the failure's first line: one diagnosis naming the rank, its pid, GPU and signal, and its remedy
    first = re.search(r"^\[sglang-subprocess-sigkilled\] " + RANK1 + r" died while serving: killed by SIGKILL: .*"
                      r" — remedy: .*$", out, re.MULTILINE)
    assert first is not None, out[-6000:]
    pid = first.group(1)
    lines = out[first.start():].splitlines()
    assert lines[1].startswith("ApiError: tp/dflash /generate: no HTTP response: connection dropped")
    assert "[connection-dropped]" not in out and "[scheduler-crash]" not in out  # folded, not listed
    result.stdout.fnmatch_lines(["FAILED *test_greedy_generation[[]tp/dflash[]] - [[]sglang-subprocess-sigkilled] "
                                 "tensor-parallel rank TP1*"])
    # the verdict JSON names the rank
    data = verdict(run_suite.reports, "tp")
    (rank,) = data["services"]["dflash"]["ranks"]
    assert rank["rank"] == 1 and rank["pid"] == int(pid) and rank["gpu"] == "visible GPU 1"
    assert rank["event"] == "died" and rank["how"] == "killed by SIGKILL" and rank["when"] == "serving"
    assert data["failures"][0]["diagnosis"][0]["folded"] == "connection-dropped"
    assert data["failures"][0]["symptom"].startswith("ApiError: ")
    # JUnit: message= is the diagnosis and remedy; the rank is a property
    message, props = _junit_failure(junit)
    assert message.startswith("[sglang-subprocess-sigkilled] tensor-parallel rank TP1 (rank 1, pid") and "remedy:" in message
    assert props["dflash.ranks"] == f"dflash: tensor-parallel rank TP1 (rank 1, pid {pid}, visible GPU 1) died while serving: killed by SIGKILL"
    # the HTML verdict table and the fleet summary name it too
    assert f"RANK dflash: tensor-parallel rank TP1 (rank 1, pid {pid}, visible GPU 1) died" in page.read_text()
    summary = json.loads((run_suite.reports / "fleet-summary.json").read_text())
    assert summary["hosts"]["tp"]["services"]["dflash"]["ranks"][0]["pid"] == int(pid)
    fleet = (run_suite.reports / "fleet-junit.xml").read_text()
    assert 'message="[sglang-subprocess-sigkilled] tensor-parallel rank TP1 (rank 1, pid' in fleet
    assert f"rank dflash: tensor-parallel rank TP1 (rank 1, pid {pid}" in fleet
    assert f"RANK dflash: tensor-parallel rank TP1 (rank 1, pid {pid}, visible GPU 1) died" in text


@pytest.mark.heavy
def test_a_rank_stopped_during_readiness_is_named_not_taken_for_a_cold_jit(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    """rank-hang=1@2: rank 1 SIGSTOPped on readiness's sampled request. Before: 'sampled phase … not answered
    yet' after the whole ready_timeout, as a cold JIT reads, naming no rank."""
    started = time.monotonic()
    junit = tmp_path / "junit.xml"
    result = run_suite("smoke", *FAULTED, "--host", str(_faulty(tmp_path, "rank-hang=1@2")), f"--junitxml={junit}")
    took = time.monotonic() - started
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    result.stdout.fnmatch_lines(["[[]tp-rank-stopped] tensor-parallel rank TP1 (rank 1, pid *, visible GPU 1) stopped "
                                 "during readiness: SIGSTOP or a debugger (process state T): * — remedy: *",
                                 "ServiceNotReady: service dflash not ready after *: sampled phase: tensor-parallel "
                                 "rank TP1 *"], consecutive=True)
    data = verdict(run_suite.reports, "tp")
    (rank,) = data["services"]["dflash"]["ranks"]
    assert (rank["rank"], rank["event"], rank["when"]) == (1, "stopped", "readiness")
    message, props = _junit_failure(junit)
    assert message.startswith("[tp-rank-stopped] tensor-parallel rank TP1")
    assert "stopped during readiness" in props["dflash.ranks"]
    assert "not answered yet" not in text.split("dflash verdict")[-1]
    # the log once: in its section (since the service started, its wait having run beside another test), not
    # again as a tail in the failure text
    assert "--- last lines of the service log ---" not in result.stdout.str()
    assert "log tp/dflash since" in result.stdout.str()
    assert took < 50  # ready_timeout is 60 s: the stopped rank ended the wait


@pytest.mark.heavy
def test_a_rank_without_kv_cache_memory_fails_start_up_naming_it(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_suite("smoke", *FAULTED, "--host", str(_faulty(tmp_path, "rank-oom=1")))
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    assert "tensor-parallel rank TP1 (rank 1, visible GPU 1) failed at start-up: RuntimeError: Not enough memory" in text
    assert "kv-cache-not-enough-memory" in text
    data = verdict(run_suite.reports, "tp")
    assert data["services"]["dflash"]["ranks"][0]["when"] == "start-up"


def test_nccl_init_that_never_ends_fails_at_its_budget_not_at_ready_timeout(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    result = run_suite("smoke", *FAULTED, "--host", str(_faulty(tmp_path, "nccl-init-hang", nccl_init_timeout="4s")))
    took = time.monotonic() - started
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    assert "TP0 (visible GPU 0), TP1 (visible GPU 1) stuck in NCCL init" in text
    assert "past nccl_init_timeout 4.00s" in text
    assert "nccl-init-stuck" in text
    assert took < 50  # ready_timeout is 60 s: the budget ended it, not readiness


@pytest.mark.heavy
def test_a_stopped_rank_is_engine_stuck_naming_the_rank(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """rank-hang=1@3: the rank stops (SIGSTOP) on the first request after readiness; the request runs out of
    --request-timeout (10 s here: the healthy service's requests take well under it on a loaded machine) and the
    stuck check names the tensor-parallel engine and the stopped rank."""
    result = run_suite("smoke", *FAULTED, "--host", str(_faulty(tmp_path, "rank-hang=1@3")), "--request-timeout=10s")
    assert_no_crash(result)
    text = _dflash_failure(run_suite, result)
    assert "tp-rank-stopped" in text and "the engine is tensor-parallel (--tp-size 2" in text
    assert re.search(RANK1 + r" stopped while serving: SIGSTOP or a debugger", text), text[-3000:]
    data = verdict(run_suite.reports, "tp")
    assert data["services"]["dflash"]["ranks"][0]["when"] == "serving"
