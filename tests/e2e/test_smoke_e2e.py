"""`pytest --host local suites/smoke` and the refserver faults, through the real plugin and suites."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e_helpers import write_profile
from support.pytest_runs import assert_no_crash, verdict


def test_local_smoke_passes_and_writes_verdict_and_html(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    html = tmp_path / "smoke.html"
    result = run_suite("smoke", "--host", "local", f"--html={html}")
    assert_no_crash(result)
    result.assert_outcomes(passed=39, skipped=5)  # the 2 GPU checks skip (no GPU here), so do none's speculation
    # and the forced tool call of the two services that serve no --tool-call-parser
    assert "warnings summary" not in result.stdout.str()  # a healthy run warns of nothing (no rewrite warning)
    result.stdout.fnmatch_lines(["*dflash verdict*", "local: PASS*host:passed*env:passed*service:passed*"
                                 "generation:passed*parity:passed*perf:passed*", "*ddtree: DDTREE*accept length*"])
    data = verdict(run_suite.reports, "local")
    assert data["verdict"] == "pass" and data["exit_code"] == 0
    assert {name: layer["outcome"] for name, layer in data["layers"].items()} == {
        "host": "passed", "env": "passed", "kernels": "not-run", "service": "passed",
        "generation": "passed", "parity": "passed", "perf": "passed"}
    assert set(data["services"]) == {"none", "dflash", "ddtree"}
    assert data["services"]["ddtree"]["algorithm"] == "DDTREE"
    assert 2.0 <= data["services"]["dflash"]["accept_length"] <= 6.0
    page = html.read_text()
    assert "dflash verdict" in page and "local" in page


def test_sampling_crash_fails_readiness_leading_with_its_diagnosis_and_remedy(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: a provisioned DFLASH service that dies on its first sampled request (the seed's SM 12.x toolkit).
    Before: the failure began 'ServiceCrashed: …', the diagnosis at line 46 of 122, the traceback three times, the
    short summary cut to '- Service...'. Now: diagnosis and remedy first, then the symptom, then where; the log
    once; one diagnosis for the one cause; each diagnosis once in the verdict section."""
    monkeypatch.setenv("COLUMNS", "250")  # pytest's short summary cuts its line to the terminal
    profile = write_profile(tmp_path, "sm120", {"dflash": ("DFLASH", ["--inject", "flashinfer-sm120"])})
    html, junit = tmp_path / "sm120.html", tmp_path / "junit.xml"
    started = time.monotonic()
    result = run_suite("smoke", "--host", str(profile), f"--html={html}", f"--junitxml={junit}", "-rf")
    assert_no_crash(result)
    # skipped: 12 blocked, the parity test (no [parity] table), the 2 GPU checks (no GPU here)
    result.assert_outcomes(passed=2, failed=1, skipped=15)
    result.stdout.fnmatch_lines([
        "*_ test_service_ready[[]sm120/dflash[]] _*",
        "[[]flashinfer-sm12x-nvcc[]] FlashInfer cannot target this SM 12.x GPU: * — remedy: point CUDA_HOME *",
        "ServiceCrashed: service dflash died during readiness: first sampled generation*killed by SIGKILL*",
        "(raised at suites/smoke/test_smoke.py:*, in test_service_ready[[]sm120/dflash[]])",
        "*dflash diagnosis*",
        "[[]flashinfer-sm12x-nvcc[]]*",
    ], consecutive=True)
    result.stdout.fnmatch_lines(["FAILED *test_service_ready[[]sm120/dflash[]] - [[]flashinfer-sm12x-nvcc[]] *"])
    text = result.stdout.str()
    # the server's traceback once (the log section), not again as a tail in the failure text
    assert text.count("RuntimeError: FlashInfer requires GPUs with sm75 or higher") == 1, text
    assert text.count("in top_k_top_p_sampling_from_probs") == 1
    # one root cause, one diagnosis: the consequences are folded into it, not listed beside it
    assert "[sampling-jit-first-sampled-request]" not in text and "[scheduler-crash]" not in text
    assert "[flashinfer-no-eligible-arch]" not in text
    verdict_section = text.split("dflash verdict")[-1].split("short test summary")[0]
    assert verdict_section.count("flashinfer-sm12x-nvcc") == 1, verdict_section
    assert verdict_section.count("remedy: point CUDA_HOME") == 1
    assert "symptom: ServiceCrashed: service dflash died during readiness" in verdict_section
    data = verdict(run_suite.reports, "sm120")
    assert data["verdict"] == "fail" and data["exit_code"] == 1
    assert data["layers"]["service"]["outcome"] == "failed"
    assert data["layers"]["generation"]["outcome"] == "blocked"
    (found,) = data["failures"][0]["diagnosis"]
    assert found["id"] == "flashinfer-sm12x-nvcc", found
    assert "sampling-jit-first-sampled-request" in found["folded"]
    # JUnit and the fleet JUnit: message= is the diagnosis and its remedy, the same first line
    xml = junit.read_text()
    assert 'message="[flashinfer-sm12x-nvcc] FlashInfer cannot target this SM 12.x GPU' in xml
    assert "remedy: point CUDA_HOME" in xml.split('message="[flashinfer-sm12x-nvcc]')[1].split('"')[0]
    fleet = (run_suite.reports / "fleet-junit.xml").read_text()
    assert 'type="flashinfer-sm12x-nvcc" message="[flashinfer-sm12x-nvcc] FlashInfer cannot target' in fleet
    page = html.read_text()
    assert "flashinfer-sm12x-nvcc" in page and "top_k_top_p_sampling_from_probs" in page
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("fault", "diagnosis", "status"),
    [
        ("missing-soundfile", "soundfile-missing", "exited with status 1"),
        ("xgrammar-structural-tag", "xgrammar-structural-tag", "exited with status 1"),
        # the refserver's start-up scheduler crash replays real S4a (KV-cache OOM): OOM is the root cause
        ("scheduler-crash", "cuda-oom-startup", "killed by SIGKILL"),
    ],
)
def test_startup_crash_is_named_within_seconds(run_suite, tmp_path: Path, fault: str, diagnosis: str,  # type: ignore[no-untyped-def]
                                               status: str) -> None:
    profile = write_profile(tmp_path, f"boot-{fault}", {"dflash": ("DFLASH", ["--inject", fault])})
    started = time.monotonic()
    result = run_suite("smoke", "--host", str(profile), "-m", "host or service or generation")
    elapsed = time.monotonic() - started
    assert_no_crash(result)
    result.assert_outcomes(passed=1, failed=1, skipped=11)  # 4 service + 6 generation tests blocked, the GPU check
    result.stdout.fnmatch_lines([f"*ServiceCrashed: service dflash died during readiness*{status}*",
                                 f"*[[]{diagnosis}[]]*"])
    assert elapsed < 30, f"a start-up crash took {elapsed:.0f}s to become a verdict"
    failure = verdict(run_suite.reports, f"boot-{fault}")["failures"][0]
    assert failure["diagnosis"][0]["id"] == diagnosis


def test_generation_only_run_fails_first_test_and_blocks_the_rest(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """-m generation: no service-layer test ran, so the first generation test carries the crash."""
    profile = write_profile(tmp_path, "gen-sm120", {"dflash": ("DFLASH", ["--inject", "flashinfer-sm120"])})
    result = run_suite("smoke", "--host", str(profile), "-m", "generation")
    assert_no_crash(result)
    result.assert_outcomes(errors=1, skipped=5)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_greedy_generation*",
                                 "*[[]flashinfer-sm12x-nvcc[]]*",
                                 "*blocked: local*" if False else "*blocked*"])


def test_oom_kill_during_a_test_fails_that_test_and_blocks_later_ones(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # readiness makes 2 generations; the 3rd completed one is answered, then the server SIGKILLs itself
    profile = write_profile(tmp_path, "oom", {"dflash": ("DFLASH", ["--inject", "oom-kill=3"])})
    result = run_suite("smoke", "--host", str(profile))
    assert_no_crash(result)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1, outcomes
    result.stdout.fnmatch_lines(["*killed by SIGKILL*", "*[[]killed-sigkill-oom[]]*"])
    data = verdict(run_suite.reports, "oom")
    # the greedy test (3rd request) fails if the death is seen right after it, else the next request is dropped
    assert data["failures"][0]["test"].rsplit("::", 1)[1] in (
        "test_greedy_generation[oom/dflash]", "test_sampled_generation[oom/dflash]")
    assert data["failures"][0]["diagnosis"][0]["id"] == "killed-sigkill-oom"
    assert data["blocked"], "tests after the death must be blocked, not run against a dead server"


@pytest.mark.parametrize(
    ("fault", "test", "message"),
    [
        ("truncated-stream", "test_streamed_generation", "stream ended without 'data: [DONE]'"),
        ("bad-json", "test_service_ready", "malformed JSON body"),  # readiness fails fast on garbage
        ("hang=3", "test_greedy_generation", "timed out"),
    ],
)
def test_broken_responses_fail_their_test_with_a_clear_message(run_suite, tmp_path: Path, fault: str, test: str,  # type: ignore[no-untyped-def]
                                                               message: str) -> None:
    profile = write_profile(tmp_path, f"resp-{fault.split('=')[0]}", {"dflash": ("DFLASH", ["--inject", fault])})
    started = time.monotonic()
    result = run_suite("smoke", "--host", str(profile), "-m", "service or generation", "--request-timeout=3s")
    assert_no_crash(result)
    assert time.monotonic() - started < 90  # generous for a loaded 2-core machine; a hang would never end
    result.stdout.fnmatch_lines([f"FAILED *{test}[[]*"])
    assert message in result.stdout.str()


def test_tree_verify_bug_fails_parity_as_a_real_divergence(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "treebug", {"none": ("NONE", []), "ddtree": ("DDTREE", ["--inject", "tree-verify-bug"])},
                            parity=("none", ["ddtree"]))
    result = run_suite("smoke", "--host", str(profile), "-m", "parity")
    assert_no_crash(result)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*diverges at token * (real, top-1/top-2 gap *"])


def test_slow_load_and_cold_jit_are_waited_for_not_failed(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "slow", {"dflash": ("DFLASH", ["--inject", "slow-load=3,cold-jit=3"])})
    result = run_suite("smoke", "--host", str(profile), "-m", "service")
    assert_no_crash(result)
    result.assert_outcomes(passed=5)  # ready, serving the profile's algorithm, speculation, command and model
    ready = verdict(run_suite.reports, "slow")["services"]["dflash"]["ready"]
    assert ready["http_s"] < ready["greedy_s"] - 1.5, ready  # HTTP answered long before a generation did
    assert ready["sampled_request_s"] >= 2.5, ready  # the first sampled request blocked (cold JIT)


def test_verdict_json_is_valid_and_documented_fields_exist(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "shape", {"none": ("NONE", [])})
    result = run_suite("smoke", "--host", str(profile), "-m", "host or service")
    result.assert_outcomes(passed=5, skipped=2)  # the GPU check skips (no GPU here), so does the speculation check
    data = json.loads((run_suite.reports / "shape.verdict.json").read_text())
    for key in ("schema", "host", "run_id", "started", "finished", "verdict", "exit_code", "layers", "services",
                "failures", "blocked", "notes"):
        assert key in data, key
