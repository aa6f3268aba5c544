"""The plugin's own guarantees, end to end: usage errors, attach mode, teardown on signals, stale cleanup,
host lock, redaction. Real pytest subprocesses, real refserver processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import SUITES, write_profile
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.config.paths import state_root
from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.services.process import pid_alive

# every run here keeps its markers apart (tests/conftest.py own_state_dir)
pytestmark = pytest.mark.usefixtures("own_state_dir")


def pytest_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]


def wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def markers(host: str) -> list[dict[str, object]]:
    folder = state_root() / "markers"
    return [json.loads(p.read_text()) for p in folder.glob(f"{host}.*.json")] if folder.is_dir() else []


@pytest.mark.parametrize(
    ("profile_text", "message"),
    [
        ('[host]\nconnection = "local://"\n[services.x]\nalgorithm = "DFLASH"\nkind = "process"\ncommand = ["x"]\n'
         'url = "htp:/x"\n', "services.x.url: expected an http(s) URL, got 'htp:/x'"),
        ('[host]\nconnection = "local://"\nbogus = 1\n[services.x]\nalgorithm = "NONE"\nkind = "process"\n'
         'command = ["x"]\n', "host.bogus: unknown key"),
        ('[host]\nconnection = "local://"\n[services.x]\nkind = "process"\ncommand = ["x"]\n',
         "services.x.algorithm: missing required key"),
        ("[host\n", "not valid TOML"),
    ],
)
def test_malformed_profile_is_a_one_line_usage_error(pytester: pytest.Pytester, tmp_path: Path, profile_text: str,
                                                     message: str) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(profile_text)
    result = pytester.runpytest_subprocess(str(SUITES / "smoke"), "--host", str(path), "-p", "no:cacheprovider")
    assert result.ret == 4
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert errors == [f"ERROR: {path}: {message}"] or (len(errors) == 1 and message in errors[0]), result.stderr.lines
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_no_target_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(str(SUITES / "smoke"), "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: *no target was given: pass --host NAME|PATH*"])
    assert "did you mean" not in result.stderr.str()


def test_testinfras_hosts_option_gets_a_did_you_mean(pytester: pytest.Pytester) -> None:
    """--hosts is testinfra's (its plugin loads with it): a user who meant --host is told so."""
    result = pytester.runpytest_subprocess(str(SUITES / "smoke"), "--hosts", "local", "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: *no target was given: pass --host NAME|PATH*"
                                 "(--hosts local is testinfra's option: did you mean --host local?)"])


def test_unknown_host_name_lists_the_known_ones(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(str(SUITES / "smoke"), "--host", "nope", "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: nope: no host profile named 'nope' in * (known: *local*)"])


def test_attach_mode_tests_a_running_server_without_host_access(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
        result = run_suite("smoke", "--attach", server.url)
        assert_no_crash(result)
        result.stdout.fnmatch_lines(["SKIPPED *: attached by URL: no host access"])
        outcomes = result.parseoutcomes()
        assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 5, outcomes
        name = f"127.0.0.1_{server.port}"  # ":" is not kept in file names
        data = verdict(run_suite.reports, name)
        assert data["layers"]["host"]["outcome"] == "skipped"
        assert data["services"]["attached"]["algorithm"] == "DFLASH"  # detected from /server_info
        assert data["services"]["attached"]["provisioned"] is False
        assert server.proc is not None and server.proc.poll() is None, "attach mode must not stop the server"


def run_log(tmp_path: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("run-*.log")))


def _start_run(profile: Path, tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    log = open(tmp_path / f"run-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(pytest_cmd(str(SUITES / "smoke"), "--host", str(profile), f"--dflash-report={tmp_path}",
                                       *extra),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_run_still_stops_what_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    name = f"interrupt-{sig.name.lower()}"
    profile = write_profile(tmp_path, name, {"dflash": ("DFLASH", ["--inject", "slow-load=60"])})
    run = _start_run(profile, tmp_path)
    try:
        wait_for(lambda: bool(markers(name)), 60, "the service to be started")
        pid = int(markers(name)[0]["pid"])  # type: ignore[arg-type]
        assert pid_alive(pid)
        run.send_signal(sig)
        rc = run.wait(timeout=60)
        assert rc == 2, f"exit {rc}, not 2 (interrupted); the run said:\n{run_log(tmp_path)[-4000:]}"
        wait_for(lambda: not pid_alive(pid), 10, "the refserver to be stopped")
        assert not markers(name), "the marker must be removed with the process"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)


SWALLOWING_TEST = """
import os, signal

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while a finalizer runs: Python drops its KeyboardInterrupt
        for _ in range(10_000):
            pass

def test_ctrl_c_lost_then_a_wait(dflash_service_raw):
    Finalized()
    dflash_service_raw.ensure_ready()

def test_ctrl_c_lost_and_no_wait_after_it(dflash_service_raw):
    dflash_service_raw.ensure_ready()
    Finalized()
"""


@pytest.mark.parametrize(("test", "raised_again"), [("test_ctrl_c_lost_then_a_wait", True),
                                                    ("test_ctrl_c_lost_and_no_wait_after_it", False)])
def test_a_ctrl_c_that_a_finalizer_swallowed_still_interrupts_the_run(tmp_path: Path, test: str,
                                                                      raised_again: bool) -> None:
    name = "swallowed"
    profile = write_profile(tmp_path, name, {"dflash": ("DFLASH", ["--inject", "slow-load=20" if raised_again else
                                                                   "slow-load=0"])})
    (tmp_path / "test_swallow.py").write_text(SWALLOWING_TEST)
    done = subprocess.run(pytest_cmd(f"{tmp_path / 'test_swallow.py'}::{test}", "--host", str(profile),
                                     f"--dflash-report={tmp_path}"), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert "Exception ignored" in done.stderr + done.stdout  # the interrupt really was dropped by Python
    # Without the latch: ready after 20 s, or passed at once; either way exit 0 and a PASS verdict.
    assert done.returncode == 2, done.stdout[-3000:]
    assert ("raised again: the first one was lost in a finalizer" in done.stdout) == raised_again
    status = verdict(tmp_path, name)
    assert status["verdict"] == "interrupted", status
    assert not markers(name), "what the run started is stopped"


CTRL_C_IN_TEARDOWN = """
import os, signal, time
from pytest_dflash.services.process import ProcessService

stop = ProcessService.stop

def stop_after_a_ctrl_c(self):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C just as the run stops what it started
    time.sleep(0.5)
    stop(self)

ProcessService.stop = stop_after_a_ctrl_c
"""


def test_a_ctrl_c_during_teardown_does_not_cut_it_short(tmp_path: Path) -> None:
    name = "ctrlc-teardown"
    profile = write_profile(tmp_path, name, {"dflash": ("DFLASH", [])})
    (tmp_path / "conftest.py").write_text(CTRL_C_IN_TEARDOWN)
    (tmp_path / "test_ready.py").write_text("def test_ready(dflash_service_raw):\n"
                                            "    dflash_service_raw.ensure_ready()\n")
    done = subprocess.run(pytest_cmd(str(tmp_path / "test_ready.py"), "--host", str(profile),
                                     f"--dflash-report={tmp_path}"), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert "Traceback" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 2, done.stdout[-3000:]
    status = verdict(tmp_path, name)
    assert status["verdict"] == "interrupted", status
    assert "SIGINT arrived while the run stopped what it started" in json.dumps(status)
    assert not markers(name), "the service is stopped and its marker removed"


def test_next_run_cleans_up_after_a_sigkilled_run(tmp_path: Path) -> None:
    name = "killed"
    profile = write_profile(tmp_path, name, {"dflash": ("DFLASH", ["--inject", "slow-load=60"])})
    run = _start_run(profile, tmp_path)
    try:
        wait_for(lambda: bool(markers(name)), 60, "the service to be started")
        pid = int(markers(name)[0]["pid"])  # type: ignore[arg-type]
        run.send_signal(signal.SIGKILL)  # no teardown at all
        run.wait(timeout=30)
        assert pid_alive(pid), "the orphan must still be running for this test to mean anything"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    clean = write_profile(tmp_path, name, {"dflash": ("DFLASH", [])})
    result = subprocess.run(pytest_cmd(str(SUITES / "smoke"), "--host", str(clean), "-m", "service",
                                       f"--dflash-report={tmp_path}"), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    assert not pid_alive(pid), "the stale refserver was not stopped"
    assert any(f"stopped stale dflash (pid {pid})" in note for note in verdict(tmp_path, name)["notes"])
    assert "note: stopped stale dflash" in result.stdout


def test_second_run_on_the_same_host_waits_for_the_lock_then_fails_clearly(tmp_path: Path) -> None:
    name = "locked"
    profile = write_profile(tmp_path, name, {"dflash": ("DFLASH", ["--inject", "slow-load=40"])})
    first = _start_run(profile, tmp_path)
    try:
        wait_for(lambda: bool(markers(name)), 60, "the first run to provision")
        second = subprocess.run(pytest_cmd(str(SUITES / "smoke"), "--host", str(profile), "-m", "service",
                                           "--lock-wait=2s", f"--dflash-report={tmp_path / 'second'}"),
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert "waiting for another run to release the host (run=" in second.stdout
        assert "another run holds the host lock (run=" in second.stdout
        assert f"pid={first.pid}" in second.stdout
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=60)


def test_secrets_never_reach_the_terminal_the_html_or_the_verdict(run_suite, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    secret = "sk-test-0123456789abcdefSECRET"
    monkeypatch.setenv("DFLASH_E2E_KEY", secret)
    profile = write_profile(tmp_path, "secret", {"dflash": ("DFLASH", ["--api-key", secret, "--inject", "flashinfer-sm120"])},
                            service_extra={"dflash": 'api_key_env = "DFLASH_E2E_KEY"'})
    html = tmp_path / "secret.html"
    result = run_suite("smoke", "--host", str(profile), f"--html={html}")
    assert_no_crash(result)
    assert result.ret == 1  # the injected crash: evidence was collected
    result.stdout.fnmatch_lines(["*--api-key ***REDACTED****"])
    assert secret not in result.stdout.str() + result.stderr.str()
    assert secret not in html.read_text()
    assert secret not in (run_suite.reports / "secret.verdict.json").read_text()


def test_service_layer_catches_a_wrong_algorithm_and_an_early_death(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "svc", {"dflash": ("NONE", []), "dies": ("DFLASH", ["--inject", "crash-after=4"])})
    # the profile claims DFLASH for a server that runs NONE
    profile.write_text(profile.read_text().replace('algorithm = "NONE"', 'algorithm = "DFLASH"', 1))
    result = run_suite("service", "--host", str(profile))
    assert_no_crash(result)
    result.stdout.fnmatch_lines(["*the profile says DFLASH, the server runs NONE*"])
    data = verdict(run_suite.reports, "svc")
    failed = {f["test"].split("::")[-1].split("@")[0] for f in data["failures"]}
    assert "test_serves_the_profiles_algorithm[svc/dflash]" in failed, failed
    assert any(name.endswith("[svc/dies]") for name in failed), failed  # it died within seconds of being ready
    assert data["layers"]["service"]["outcome"] == "failed"


DEAD_BEFORE_THE_NEXT_TEST = """
import time

def test_waits_on_ok_for_the_other_to_die(dflash_service_raw):  # its death is no part of this test
    dies = dflash_service_raw.host.service("dies")
    dies.ensure_ready()  # ready, then dead a few seconds later, while this test holds only "ok"
    deadline = time.monotonic() + 60
    while not dies.manager.state().dead and time.monotonic() < deadline:
        time.sleep(0.1)
    assert dies.manager.state().dead, "the server did not die"

def test_uses_the_dead_one(dflash_service_raw):  # its log mark is taken after the death
    assert dflash_service_raw.name == "dies"
"""


def test_a_service_found_dead_after_its_crash_is_diagnosed_from_its_last_lines(tmp_path: Path) -> None:
    """H200 run 4: a scheduler died of SIGSEGV between two tests; the next test found its server killed by SIGKILL
    and, with no log lines after its own mark, guessed the OOM killer. The window now reaches back to the start of a
    dead service, so SGLang's own line names the child and its exit code."""
    name = "segv"
    profile = write_profile(tmp_path, name, {"ok": ("DFLASH", []), "dies": ("DFLASH", ["--inject", "scheduler-segv=5"])})
    (tmp_path / "test_dead.py").write_text(DEAD_BEFORE_THE_NEXT_TEST)
    done = subprocess.run(pytest_cmd(str(tmp_path / "test_dead.py"), "--host", str(profile), "-k",
                                     "(waits_on_ok and segv/ok) or (dead_one and segv/dies)",
                                     f"--dflash-report={tmp_path}"), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    failures = verdict(tmp_path, name)["failures"]
    assert [f["test"].split("::")[-1] for f in failures] == ["test_uses_the_dead_one[segv/dies]"], done.stdout[-3000:]
    assert [d["id"] for d in failures[0]["diagnosis"]] == ["sglang-subprocess-died"], failures
    assert "crashed with exit code -11" in failures[0]["diagnosis"][0]["evidence"]
    assert "killed-sigkill-oom" not in done.stdout
    assert "crashed with exit code -11" in done.stdout  # the log's last lines are in the report


def test_services_started_together_wait_for_readiness_together(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A peer started beside the service a test asked for waits in the background: on the H200 each SGLang process
    took 80-114 s for its first sampled request, so one-after-another waits added up to minutes (issue 16's run)."""
    profile = write_profile(tmp_path, "together", {"a": ("DFLASH", ["--inject", "cold-jit=3"]),
                                                   "b": ("DFLASH", ["--inject", "cold-jit=3"])})
    result = run_suite("service", "--host", str(profile), "-k", "ready_by_real_generation")
    assert_no_crash(result)
    assert result.ret in (0, 1) and result.parseoutcomes().get("passed") == 2, result.stdout.str()[-3000:]
    ready = {name: verdict(run_suite.reports, "together")["services"][name]["ready"] for name in ("a", "b")}
    # the waits overlapped: the later one began before the earlier one was ready (one after another, it could not)
    assert max(r["waited_from"] for r in ready.values()) < min(r["ready_at"] for r in ready.values()), ready


@pytest.mark.parametrize("concurrency", ["8", "1"])
def test_without_xdist_the_hosts_come_up_in_parallel(run_suite, tmp_path: Path, concurrency: str) -> None:  # type: ignore[no-untyped-def]
    """--fleet-concurrency (default 8): every host's services are readied at once before the first test; 1 keeps
    host after host. The hosts' verdicts carry when each wait began and ended."""
    names = ("h1", "h2")
    hosts = [write_profile(tmp_path, name, {"dflash": ("DFLASH", ["--inject", "cold-jit=3"])}) for name in names]
    result = run_suite("service", "--host", str(hosts[0]), "--host", str(hosts[1]), "-k", "ready_by_real_generation",
                       f"--fleet-concurrency={concurrency}")
    assert_no_crash(result)
    assert result.parseoutcomes().get("passed") == 2, result.stdout.str()[-3000:]
    ready = [verdict(run_suite.reports, name)["services"]["dflash"]["ready"] for name in names]
    overlapped = max(r["waited_from"] for r in ready) < min(r["ready_at"] for r in ready)
    assert overlapped is (concurrency == "8"), ready
    if concurrency == "8":
        result.stdout.fnmatch_lines(["*fleet pre-flight: readying 2 hosts, 2 at a time*"])


@pytest.mark.parametrize("concurrency", ["8", "1"])
def test_the_hosts_gpu_probes_run_in_the_pre_flight_in_parallel(run_suite, tmp_path: Path, concurrency: str) -> None:  # type: ignore[no-untyped-def]
    """The GPU inventory probe (a python run on the host, over ssh on a real fleet) runs for every host in the
    pre-flight, at once, and the host layer's test reads its result; with --fleet-concurrency 1, host after host."""
    calls = tmp_path / "probe-calls.log"
    python = tmp_path / "slow-python"  # the host's python for probes: logs when each probe runs, takes >= 1 s
    python.write_text(f'#!/bin/bash\necho "start $(date +%s.%N)" >> {calls}\nsleep 1\n"{sys.executable}" "$@"\n'
                      f'rc=$?\necho "end $(date +%s.%N)" >> {calls}\nexit $rc\n')
    python.chmod(0o755)
    hosts = []
    for name in ("g1", "g2"):
        path = tmp_path / f"{name}.toml"
        path.write_text(f'[host]\nconnection = "local://"\npython = "{python}"\n\n'  # the service is not tested
                        '[services.s]\nkind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n')
        hosts.append(path)
    result = run_suite("smoke", "--host", str(hosts[0]), "--host", str(hosts[1]), "-k", "gpus_visible",
                       f"--fleet-concurrency={concurrency}")
    assert_no_crash(result)
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == 2 and not outcomes.get("failed"), result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*no GPU on g1: nvidia-smi not found on PATH*"])
    # -k deselected every test of service s (nothing listens on its URL): the pre-flight must not wait for it
    assert "http phase" not in result.stdout.str()
    if concurrency == "8":
        result.stdout.fnmatch_lines(["*fleet pre-flight: 2 hosts in *s, 0 service(s) not ready"])
    events = [line.split() for line in calls.read_text().splitlines()]
    assert len(events) == 4, events  # one probe per host, read from the cache by the test
    starts = [float(t) for kind, t in events if kind == "start"]
    ends = [float(t) for kind, t in events if kind == "end"]
    assert (max(starts) < min(ends)) is (concurrency == "8"), events
