"""Units that die, through the plugin over ssh: at start-up, on the first sampled request, by SIGKILL.

Each scenario provisions one refserver unit with a fault (`--inject`), runs the real smoke suite, and
checks the verdict, the evidence (journal tail, unit properties), the diagnosis and the timing
against what systemd itself recorded in the guest's journal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from remote_helpers import Guest, RefUnit, Sampler, SuiteRun, unit_name, write_profile
from testhost import TestHost

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

Runs = Callable[..., SuiteRun]
LAYERS = ("-m", "host or service or generation")


def test_startup_crash_fails_within_2s_with_journal_tail_and_diagnosis(testhost: TestHost, guest: Guest,
                                                                       runs: Runs, tmp_path: Path) -> None:
    spec = RefUnit(unit_name("soundfile"), "DFLASH", "--inject missing-soundfile")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "soundfile", {"dflash": spec})
    outcome = runs(profile, "--provision", *LAYERS).wait(120)
    outcome.assert_clean()
    test = "test_service_ready[soundfile/dflash]"

    # Within 2 s of the death systemd recorded, the failing report existed, evidence and diagnosis included.
    crashes = guest.exit_times(spec.unit)
    assert crashes, guest.journal_text(spec.unit)
    delay = outcome.reported(test) - crashes[0]
    print(f"crash -> failing verdict with evidence: {delay:.2f}s")
    assert 0 <= delay <= 2.0, f"verdict {delay:.2f}s after the crash"

    assert ("ServiceCrashed: service dflash died during readiness: waiting for the HTTP server: exited with status 1, "
            "Result=exit-code") in outcome.out
    journal = outcome.section("journal soundfile/dflash since", test)
    assert "ModuleNotFoundError: No module named 'soundfile'" in journal
    assert "Main process exited, code=exited, status=1/FAILURE" in journal
    unit = outcome.section("service soundfile/dflash", test)
    assert f"unit={spec.unit}" in unit and "ExecMainStatus=1" in unit and "Result=exit-code" in unit
    diagnosis = outcome.section("dflash diagnosis", test)
    assert diagnosis.startswith("[soundfile-missing]")
    assert "/opt/dflash-venv/bin/python -m pip install soundfile" in diagnosis  # the guest's python, from the profile

    data = outcome.verdict("soundfile")
    assert data["verdict"] == "fail"
    assert [f["test"].rsplit("::", 1)[1] for f in data["failures"]] == [test]
    assert data["failures"][0]["diagnosis"][0]["id"] == "soundfile-missing"
    assert data["layers"]["host"]["outcome"] == "passed"
    assert data["layers"]["generation"]["outcome"] == "blocked"
    assert all(b["message"].startswith("blocked: service layer failed on soundfile/dflash") for b in data["blocked"])


def test_death_on_first_sampled_request_while_is_active_said_active(testhost: TestHost, guest: Guest, runs: Runs,
                                                                    tmp_path: Path) -> None:
    spec = RefUnit(unit_name("sm120"), "DFLASH", "--inject flashinfer-sm120")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "sm120", {"dflash": spec})
    with Sampler(guest, spec.unit) as sampler:
        outcome = runs(profile, "--provision", *LAYERS).wait(120)
    outcome.assert_clean()
    test = "test_service_ready[sm120/dflash]"

    # systemd's own view, sampled from inside the guest during the run: "active" after the greedy
    # generation had succeeded, seconds before the unit died of the sampled one.
    entries = guest.journal(spec.unit)
    greedy_done = next(int(e["__REALTIME_TIMESTAMP"]) / 1e6 for e in entries
                       if f"{testhost.host_ip}:" in str(e.get("MESSAGE")) and '"POST /generate HTTP/1.1" 200' in
                       str(e.get("MESSAGE")))
    crash = guest.exit_times(spec.unit)[0]
    assert [s for t, s in sampler.samples if greedy_done < t < crash - 0.1].count("active") >= 3, sampler.samples
    assert "active" not in [s for t, s in sampler.samples if t > crash + 0.5]

    assert ("ServiceCrashed: service dflash died during readiness: first sampled generation (temperature 0.8, "
            "top_k 20, top_p 0.9): killed by SIGKILL, Result=signal, status=9/KILL") in outcome.out
    journal = outcome.section("journal sm120/dflash since", test)
    assert "RuntimeError: FlashInfer requires GPUs with sm75 or higher" in journal
    assert "top_k_top_p_sampling_from_probs" in journal
    assert "Main process exited, code=killed, status=9/KILL" in journal
    unit = outcome.section("service sm120/dflash", test)
    assert "Result=signal" in unit and "ExecMainStatus=9" in unit and "ExecMainCode=2" in unit  # CLD_KILLED
    assert outcome.section("dflash diagnosis", test).startswith("[flashinfer-sm12x-nvcc]")

    data = outcome.verdict("sm120")
    assert [f["test"].rsplit("::", 1)[1] for f in data["failures"]] == [test]
    ids = [d["id"] for d in data["failures"][0]["diagnosis"]]
    # one diagnosis for the one event (issue 41): the JIT's own entry is folded into it, named there
    assert ids == ["flashinfer-sm12x-nvcc"], ids
    assert "sampling-jit-first-sampled-request" in data["failures"][0]["diagnosis"][0]["folded"]
    assert data["layers"]["generation"]["outcome"] == "blocked"  # never run against the dead server


def test_sigkill_reports_signal_9_and_oom_diagnosis(testhost: TestHost, guest: Guest, runs: Runs,
                                                    tmp_path: Path) -> None:
    # readiness makes 2 generations; the 3rd (the greedy test's) is answered, then the server SIGKILLs itself
    spec = RefUnit(unit_name("oom"), "DFLASH", "--inject oom-kill=3")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "oom", {"dflash": spec})
    outcome = runs(profile, "--provision", *LAYERS).wait(120)
    outcome.assert_clean()

    data = outcome.verdict("oom")
    assert len(data["failures"]) == 1, data["failures"]
    failure = data["failures"][0]
    # The death shows right after the greedy test (its check of the unit), or as the next request's failure.
    test = failure["test"].rsplit("::", 1)[1]
    assert test in ("test_greedy_generation[oom/dflash]", "test_sampled_generation[oom/dflash]")
    assert failure["diagnosis"][0]["id"] == "killed-sigkill-oom"
    assert "killed by SIGKILL" in failure["diagnosis"][0]["title"] and "(OOM?)" in failure["diagnosis"][0]["title"]
    unit = outcome.section("service oom/dflash", test)
    assert "state=killed by SIGKILL, Result=signal, status=9/KILL" in unit
    assert "ExecMainStatus=9" in unit and "Result=signal" in unit
    assert "[killed-sigkill-oom] killed by SIGKILL with no traceback (OOM?)" in outcome.out
    assert guest.show(spec.unit)["LoadState"] == "not-found"  # torn down all the same
    assert data["blocked"], "tests after the death must be blocked, not run against a dead server"
    assert all("killed by SIGKILL" in b["message"] for b in data["blocked"])
