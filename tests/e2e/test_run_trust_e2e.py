"""Interrupted, partial and foreign-failure runs never pass; the gate sees everything; no silent blocks;
pytest-timeout kills are the service's failure (issue 11, items 2, 3, 5, 6). Real pytest runs of the real
suites against real refserver processes."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import SUITES, write_profile
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.report.verdict import NEVER_FINISHED


def pytest_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--request-timeout=20s", *args]


def child_env(tmp_path: Path) -> dict[str, str]:
    """A run's environment, built as a fresh machine's shell has it (`env -i HOME PATH`) plus its own state
    folder, never inherited from the harness: a PYTHONUNBUFFERED there would hide a progress line the plugin did
    not flush, and the tests that wait for a line would pass here and fail for a newcomer."""
    return {"HOME": os.environ.get("HOME", "/root"), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "DFLASH_STATE_DIR": str(tmp_path / "state")}


def start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(pytest_cmd(*args, f"--dflash-report={tmp_path}"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=tmp_path,
                            env=child_env(tmp_path))


def read_until(proc: subprocess.Popen[str], needle: str, timeout_s: float) -> str:
    """Read the run's output until `needle` appears (bounded; fails with what was seen). Reads the pipe's file
    descriptor directly, so nothing is left buffered in the text wrapper for a later communicate()."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = ""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=0.2):
                data = os.read(fd, 65536)
                if not data:
                    break
                seen += data.decode(errors="replace")
                if needle in seen:
                    return seen
    raise AssertionError(f"{needle!r} not seen in {timeout_s}s; output:\n{seen[-3000:]}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_during_a_run_is_interrupted_never_pass(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM (a pipeline's cancel) and SIGHUP (the ssh session or terminal went away) stop the run as Ctrl-C
    does: interrupted, and the server it started is stopped."""
    profile = write_profile(tmp_path, "term", {"plain": ("NONE", ["--inject", "cold-jit=60"])})
    proc = start(tmp_path, str(SUITES / "smoke"), "--host", str(profile))
    try:
        seen = read_until(proc, "term/plain: started", 90)
        port = int(seen.split("term/plain: started (http://127.0.0.1:")[1].split(")")[0])
        time.sleep(1.0)  # inside the readiness wait: the warm-up takes 60 s
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, out[-3000:]
    with pytest.raises(OSError):  # the refserver it started is gone (a SIGHUP used to leave it running)
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    data = verdict(tmp_path, "term")
    assert data["verdict"] == "interrupted", data["verdict"]
    assert data["complete"] is False and "interrupted" in data["interrupted"]
    # the test the SIGTERM came in (readiness of term/plain) is named as the first one that never finished
    assert "never finished (first: " in data["interrupted"] and "[term/plain]" in data["interrupted"], data["interrupted"]
    assert "PASS" not in out.split("dflash verdict")[-1].split("\n")[1], out[-2000:]
    assert "term: INTERRUPTED" in out
    summary = json.loads((tmp_path / "fleet-summary.json").read_text())
    assert summary["totals"]["pass"] == 0 and summary["totals"]["interrupted"] == 1
    assert "fleet: one host, term: INTERRUPTED" in out
    assert "dflash_host_pass{" in (tmp_path / "fleet.prom").read_text()
    assert 'dflash_host_pass{host="term"} 0' in (tmp_path / "fleet.prom").read_text()
    assert not (tmp_path / "history" / "term" / "last-good.verdict.json").exists()


@pytest.mark.heavy
def test_a_sigkilled_run_leaves_an_interrupted_verdict_not_an_old_pass(tmp_path: Path) -> None:
    stale = tmp_path / "killed.verdict.json"
    stale.write_text(json.dumps({"verdict": "pass", "host": "killed"}))  # what an earlier run left
    profile = write_profile(tmp_path, "killed", {"plain": ("NONE", ["--inject", "slow-load=60"])})
    proc = start(tmp_path, str(SUITES / "smoke"), "--host", str(profile))
    try:
        read_until(proc, "killed/plain: started", 90)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    data = verdict(tmp_path, "killed")
    assert data["verdict"] == "interrupted" and data["interrupted"] == NEVER_FINISHED
    # the next run removes what the killed one left running (its own reaping), and passes again
    clean = write_profile(tmp_path, "killed", {"plain": ("NONE", [])})
    again = subprocess.run(pytest_cmd(str(SUITES / "smoke"), "--host", str(clean), f"--dflash-report={tmp_path}"),
                           capture_output=True, text=True, timeout=240, cwd=tmp_path, env=child_env(tmp_path))
    assert again.returncode == 0, again.stdout[-3000:]
    assert verdict(tmp_path, "killed")["verdict"] == "pass"


def test_stopped_by_x_is_interrupted(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "stopx", {"plain": ("NONE", ["--inject", "truncated-stream"])})
    result = run_suite("smoke", "--host", str(profile), "-x")
    assert_no_crash(result)
    assert result.ret == 1
    data = verdict(run_suite.reports, "stopx")
    assert data["verdict"] == "interrupted" and "stopped early" in data["interrupted"], data["interrupted"]
    assert data["tests_verdict"] == "fail"


def test_a_narrowed_run_is_partial_and_never_green_in_the_fleet_view(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "narrow", {"plain": ("NONE", [])})
    result = run_suite("smoke", "--host", str(profile), "-k", "greedy")
    assert_no_crash(result)
    assert result.ret == 0  # nothing failed: the narrowed run itself is fine
    data = verdict(run_suite.reports, "narrow")
    assert data["verdict"] == "partial", data["verdict"]
    assert data["partial"][0] == "-k 'greedy'"  # what the options say, then what pytest did: it deselected tests
    assert data["selection"]["plugin_version"] and "-k" in data["selection"]["args"]
    assert data["selection"]["suites"] == ["smoke"] and "generation" in data["selection"]["layers"]
    result.stdout.fnmatch_lines(["*fleet: one host, narrow: PARTIAL*"])
    assert not (run_suite.reports / "history" / "narrow" / "last-good.verdict.json").exists()
    whole = run_suite("smoke", "--host", str(profile))
    assert whole.ret == 0 and verdict(run_suite.reports, "narrow")["verdict"] == "pass"
    assert verdict(run_suite.reports, "narrow")["partial"] == []
    # the counts are what pytest did: everything the whole run selected but the one greedy test was deselected
    everything = verdict(run_suite.reports, "narrow")["tests"]["selected"]
    # -k greedy keeps test_greedy_generation and test_greedy_parity (one "does not apply" skip: no [parity])
    assert data["tests"] == {"selected": 2, "finished": 2, "deselected": everything - 2, "lost": [],
                            "uncollected": []}
    assert data["partial"][1].startswith(f"{everything - 2} test(s) of this host deselected after collection")


def test_a_chosen_suite_is_a_scope_and_only_options_narrow_it(tmp_path: Path) -> None:
    """Choosing suites declares the run's scope (named, never partial by itself: before, `suites/parity` alone was
    'partial: ran parity: 1 of 8 suites' while a gate over it passed); -k, -m, --deselect and node ids narrow it."""
    from pytest_dflash.report.scope import Scope, narrowed_by

    class Option:
        keyword = markexpr = ""
        lf = False
        deselect = None

    class Config:
        option = Option()
        pluginmanager = type("PM", (), {"get_plugin": staticmethod(lambda name: None)})()
        invocation_params = type("IP", (), {"args": ("suites/parity",)})()

    every = ("env", "generation", "host", "kernels", "parity", "perf", "service", "smoke")
    assert narrowed_by(Config()) == []  # type: ignore[arg-type]
    Config.option.keyword = "greedy"
    Config.invocation_params.args = ("suites/parity/test_parity.py::test_x",)  # type: ignore[attr-defined]
    assert narrowed_by(Config()) == ["-k 'greedy'", "selected by node id (1)"]  # type: ignore[arg-type]
    assert Scope(("parity",), every).text() == "parity (1 of 8 suites)" and not Scope(("parity",), every).whole
    assert Scope(every, every).text() == "all 8 suites" and Scope(every, every).whole
    assert Scope(("smoke",), every, ("tests/mine",)).text() == "smoke (1 of 8 suites), tests/mine"


def _gate_suite(tmp_path: Path, extra_test: str) -> Path:
    """A copy of the smoke suite's greedy test beside a test file that fails outside the dflash tests."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_gated.py").write_text(
        "import pytest\nfrom pytest_dflash.api import ServiceHandle, greedy\n\n"
        "@pytest.mark.generation\n"
        "def test_greedy(dflash_service: ServiceHandle) -> None:\n"
        "    greedy(dflash_service.client, native=dflash_service.native)\n")
    (suite / "test_other.py").write_text(extra_test)
    return suite


@pytest.mark.parametrize(("extra", "args", "why"), [
    ("def test_unrelated() -> None:\n    assert False, 'not a dflash test'\n", (), "test_other.py::test_unrelated"),
    ("import nonexistent_module_for_the_gate\n", ("--continue-on-collection-errors",), "collection error"),
], ids=["foreign-failure", "collection-error"])
def test_the_gate_refuses_what_it_cannot_see(tmp_path: Path, extra: str, args: tuple[str, ...], why: str) -> None:
    suite = _gate_suite(tmp_path, extra)
    profile = write_profile(tmp_path, "gated", {"plain": ("NONE", [])})
    result = subprocess.run(pytest_cmd(str(suite), "--host", str(profile), "--gate", "generation",
                                       f"--dflash-report={tmp_path}", *args),
                            capture_output=True, text=True, timeout=240, cwd=tmp_path, env=child_env(tmp_path))
    assert result.returncode == 1, result.stdout[-3000:]  # before: the gate turned this 1 into 0
    assert "gate generation: FAILED" in result.stdout
    data = verdict(tmp_path, "gated")
    if why == "collection error":  # the run is not whole: no host passes it
        assert "gate refused: the run was interrupted: collection error in " in result.stdout, result.stdout[-3000:]
        assert data["verdict"] == "interrupted" and "collection error" in data["interrupted"], data["interrupted"]
    else:  # a failure outside the dflash tests: the run failed, so no host passes it
        assert "gate refused: outside the dflash tests: " in result.stdout and why in result.stdout
        assert data["verdict"] == "fail" and data["foreign"], data
    gate = data["gate"]
    assert gate["passed"] is False and gate["hosts"]["gated"] == {"generation": "passed"}


def test_a_crashed_xdist_worker_fails_the_gate(tmp_path: Path) -> None:
    suite = _gate_suite(tmp_path, "import os\n\ndef test_crash() -> None:\n    os._exit(3)\n")
    profile = write_profile(tmp_path, "crashy", {"plain": ("NONE", [])})
    result = subprocess.run(pytest_cmd(str(suite), "--host", str(profile), "--gate", "generation", "-n", "2",
                                       f"--dflash-report={tmp_path}"),
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=child_env(tmp_path))
    assert result.returncode != 0, result.stdout[-3000:]
    assert "gate generation: FAILED" in result.stdout
    assert "crashed" in result.stdout


def test_a_peer_that_failed_to_start_fails_a_test_then_blocks(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "peers", {"good": ("NONE", []), "bad": ("NONE", [])},
                            service_extra={"good": "gpus = [0]", "bad": "gpus = [1]"})
    # the peer's program does not exist: its start fails while the first service starts (one batch)
    text = profile.read_text().replace('[services.bad]\nkind = "process"\nalgorithm = "NONE"\ncommand = ["{python}"',
                                       '[services.bad]\nkind = "process"\nalgorithm = "NONE"\ncommand = ["/nonexistent/python"')
    assert "/nonexistent/python" in text
    profile.write_text(text)
    result = run_suite("generation", "--host", str(profile), "-m", "generation")
    assert_no_crash(result)
    assert result.ret == 1
    data = verdict(run_suite.reports, "peers")
    bad_failures = [f for f in data["failures"] if f["services"] == ["bad"]]
    assert len(bad_failures) == 1, data["failures"]  # ONE failing test names the root cause…
    first = bad_failures[0]["test"]
    bad_blocked = [b for b in data["blocked"] if b["services"] == ["bad"]]
    assert bad_blocked and all(first in b["message"] for b in bad_blocked), bad_blocked  # …the rest name it
    assert data["layers"]["generation"]["outcome"] == "failed"


def test_a_host_with_only_blocked_tests_exits_1(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # the service dies at start: its first test fails, every other is blocked — and the exit code says so
    profile = write_profile(tmp_path, "blocked", {"plain": ("NONE", ["--inject", "missing-soundfile"])})
    result = run_suite("generation", "--host", str(profile), "-m", "generation", "-k", "not greedy")
    assert_no_crash(result)
    assert result.ret == 1
    data = verdict(run_suite.reports, "blocked")
    assert data["verdict"] == "fail" and data["blocked"], data


def test_a_pytest_timeout_kill_fails_the_service_and_blocks_its_other_tests(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "killedby", {"plain": ("NONE", ["--inject", "cold-jit=120"])})
    started = time.monotonic()
    result = run_suite("smoke", "--host", str(profile), "--timeout", "12", "-p", "timeout")
    took = time.monotonic() - started
    assert_no_crash(result)
    assert result.ret == 1
    data = verdict(run_suite.reports, "killedby")
    assert len(data["failures"]) == 1, data["failures"]  # the killed test…
    assert data["blocked"] and all("pytest-timeout" in b["message"] for b in data["blocked"]), data["blocked"]
    assert took < 100, f"{took:.0f}s: later tests waited again instead of being blocked"


def test_collect_only_leaves_the_last_verdict_alone(tmp_path: Path) -> None:
    """A listing is not a run: it neither writes 'interrupted' over the host's verdict nor claims anything."""
    last = tmp_path / "listed.verdict.json"
    last.write_text(json.dumps({"verdict": "fail", "host": "listed"}))
    profile = write_profile(tmp_path, "listed", {"plain": ("NONE", [])})
    result = subprocess.run(pytest_cmd(str(SUITES / "smoke"), "--host", str(profile), "--collect-only", "-q",
                                       f"--dflash-report={tmp_path}"), capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=child_env(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert json.loads(last.read_text()) == {"verdict": "fail", "host": "listed"}
    assert "dflash verdict" not in result.stdout
