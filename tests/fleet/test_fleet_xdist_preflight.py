"""Hosts in parallel inside an xdist worker (fleet/scheduling.py + run/preflight.py), in real pytest runs: -n 2 over
four hosts, each with its own refserver process that is slow to become ready (its first sampled request blocks
3 s, like FlashInfer's cold JIT)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.config.paths import state_root
from pytest_dflash.services.process import pid_alive

# Names no other self-test provisions: host locks live in the shared state dir, and a CI worker running another
# test on a host of the same name holds its lock (this test then waits, host after host).
HOSTS = ("xp1", "xp2", "xp3", "xp4")
TEST_FILE = """
import os
import pytest

def _log(what):
    with open(os.environ["FLEET_LOG"], "a") as log:
        log.write(what + " " + os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")

@pytest.mark.host
def test_host(request, dflash_host):
    _log(request.node.nodeid)

@pytest.mark.service
def test_ready(request, dflash_service):
    assert dflash_service.ready is not None
    _log(request.node.nodeid)

def test_not_a_host_test(request):
    _log(request.node.nodeid)
"""


def write_profile(directory: Path, name: str, *, inject: str = "cold-jit=3") -> Path:
    """One refserver (NONE: the cheapest); by default it answers its first sampled request only after 3 s."""
    command = ["{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
               "--speculative-algorithm", "NONE", "--inject", inject]
    path = directory / f"{name}.toml"
    path.write_text("\n".join([
        "[host]", 'connection = "local://"', f'python = "{sys.executable}"', 'provision = "always"', "",
        "[services.dflash]", 'kind = "process"', 'algorithm = "NONE"', f"command = {json.dumps(command)}",
        'ready_timeout = "60s"', ""]))
    return path


def overlap(windows: list[dict[str, float]]) -> bool:
    """Some wait began before another had ended (one after another, none can)."""
    return max(w["waited_from"] for w in windows) < min(w["ready_at"] for w in windows)


@pytest.mark.parametrize("concurrency", ["8", "1"])
def test_a_workers_hosts_become_ready_together(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                               concurrency: str) -> None:
    """With -n 2 each worker owns two of the four hosts and readies both before its first test, so their readiness
    windows overlap inside the worker; --fleet-concurrency 1 keeps host after host. Either way every test runs
    exactly once, a host's tests in one worker, and the test that targets no host runs too."""
    pytester.makepyfile(test_hosts=TEST_FILE)
    fleet = pytester.path / "fleet"
    fleet.mkdir()
    for name in HOSTS:
        write_profile(fleet, name)
    log = pytester.path / "ran.log"
    monkeypatch.setenv("FLEET_LOG", str(log))
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fleet", str(fleet), f"--dflash-report={reports}",
                                           "-n", "2", f"--fleet-concurrency={concurrency}", "--request-timeout=20s")
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=2 * len(HOSTS) + 1)

    ran = [line.rsplit(" ", 1) for line in log.read_text().splitlines()]
    nodeids = [nodeid for nodeid, _ in ran]
    assert len(nodeids) == len(set(nodeids)) == 2 * len(HOSTS) + 1, ran  # each test exactly once
    workers_of: dict[str, set[str]] = defaultdict(set)
    for nodeid, worker in ran:
        if "[" in nodeid:
            workers_of[nodeid.split("[", 1)[1].split("/", 1)[0].split("]", 1)[0]].add(worker)
    assert sorted(workers_of) == list(HOSTS), ran
    assert all(len(workers) == 1 for workers in workers_of.values()), workers_of
    hosts_of: dict[str, list[str]] = defaultdict(list)
    for host, (worker,) in workers_of.items():
        hosts_of[worker].append(host)
    assert sorted(hosts_of) == ["gw0", "gw1"] and all(len(h) == 2 for h in hosts_of.values()), hosts_of

    for worker, hosts in hosts_of.items():
        windows = [verdict(reports, host)["services"]["dflash"]["ready"] for host in hosts]
        assert overlap(windows) is (concurrency == "8"), (worker, hosts, windows)
    if concurrency == "8":
        result.stdout.fnmatch_lines(["*fleet pre-flight (gw0): readying 2 hosts, 2 at a time*"])
    else:
        assert "fleet pre-flight" not in result.stdout.str()


TIMED_TEST_FILE = """
import os
import time
import pytest

@pytest.mark.service
def test_ready(request, dflash_service):
    with open(os.environ["FLEET_LOG"], "a") as log:
        log.write(f"{dflash_service.host.name} {time.time()}\\n")
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["no-xdist", "xdist"])
def test_a_hosts_tests_run_while_later_hosts_still_come_up(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                           workers: list[str]) -> None:
    """The pre-flight runs behind the tests: the first host (ready at once) has its test run while the second
    host's first sampled request still blocks (a 5 s cold JIT), not after it; the second host's test then waits
    for its own host and passes."""
    pytester.makepyfile(test_hosts=TIMED_TEST_FILE)
    fleet = pytester.path / "fleet"
    fleet.mkdir()
    # (fast, slow) pairs; under xdist the hosts alternate between the workers: gw0 gets pp1, pp3 and gw1 pp2, pp4
    pairs = [("pp1-fast", "pp3-slow"), ("pp2-fast", "pp4-slow")] if workers else [("pp1-fast", "pp2-slow")]
    hosts = [name for pair in pairs for name in pair]
    for name in hosts:
        write_profile(fleet, name, inject="cold-jit=0" if name.endswith("fast") else "cold-jit=5")
    log = pytester.path / "ran.log"
    monkeypatch.setenv("FLEET_LOG", str(log))
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fleet", str(fleet), f"--dflash-report={reports}",
                                           "--request-timeout=20s", *workers)
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=len(hosts))
    ran = dict(line.split() for line in log.read_text().splitlines())
    for fast, slow in pairs:
        slow_ready = verdict(reports, slow)["services"]["dflash"]["ready"]
        assert float(ran[fast]) < slow_ready["ready_at"] - 1, (ran, slow_ready)
        assert float(ran[slow]) >= slow_ready["ready_at"] - 0.01, (ran, slow_ready)


def test_collect_only_readies_nothing(pytester: pytest.Pytester) -> None:
    """--collect-only lists the tests of every host and starts no service (no pre-flight in any process)."""
    pytester.makepyfile(test_hosts=TEST_FILE)
    fleet = pytester.path / "fleet"
    fleet.mkdir()
    for name in HOSTS:
        write_profile(fleet, name)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fleet", str(fleet), "-n", "2",
                                           "--collect-only", "-q")
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()
    assert "pre-flight" not in result.stdout.str() and "started" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*test_ready[[]xp4/dflash[]]*"])


def markers(host: str) -> list[dict[str, object]]:
    folder = state_root() / "markers"
    return [json.loads(p.read_text()) for p in folder.glob(f"{host}.*.json")] if folder.is_dir() else []


@pytest.mark.usefixtures("own_state_dir")
def test_ctrl_c_during_the_workers_preflight_stops_every_service(pytester: pytest.Pytester) -> None:
    """All four hosts' services are started at once (two per worker) and none gets ready for 120 s; Ctrl-C (SIGINT
    to the terminal's process group: the controller and its workers) ends the run as interrupted and stops them."""
    pytester.makepyfile(test_hosts=TEST_FILE)
    fleet = pytester.path / "fleet"
    fleet.mkdir()
    names = [f"xdist-ctrl-c-{host}" for host in HOSTS]
    for name in names:
        write_profile(fleet, name, inject="slow-load=120")
    log = open(pytester.path / "run.log", "wb")  # noqa: SIM115 - closed below, after the process ended
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fleet", str(fleet),
                            f"--dflash-report={pytester.path / 'reports'}", "-n", "2"],
                           cwd=pytester.path, env={**os.environ, "FLEET_LOG": str(pytester.path / "ran.log")},
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Within 45 s (< slow-load): a worker readying host after host would have started only one of its two.
        deadline = time.monotonic() + 45
        while not all(markers(name) for name in names):
            assert run.poll() is None and time.monotonic() < deadline, (pytester.path / "run.log").read_text()
            time.sleep(0.2)
        pids = [int(str(markers(name)[0]["pid"])) for name in names]
        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(timeout=60) == 2, (pytester.path / "run.log").read_text()  # pytest: interrupted
        deadline = time.monotonic() + 15
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(pid_alive(pid) for pid in pids), "a refserver outlived the interrupted run"
        assert not any(markers(name) for name in names)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
        log.close()
