"""Two runs against the same host do not collide.

- The host lock (a remote `flock` held by an ssh session) makes a second provisioning run wait, with a
  message, until the first has torn down, or, with a short --lock-wait, fail clearly, naming the run
  that holds the host, without touching the host. (The first run's unit loads slowly,
  `--inject slow-load=S`, so it holds the lock for seconds.)
- A busy lock always names its owner (the owner line may arrive with BUSY in one chunk).
- Their ssh connections are their own: one run closing its multiplexed connection at teardown never
  cuts a command another run has in flight.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from remote_helpers import REMOTE_LOCK, REMOTE_OWNER, Guest, RefUnit, SuiteRun, unit_name, write_profile
from testhost import TestHost

from pytest_dflash.config.loader import load_profile
from pytest_dflash.errors import ServiceBusy
from pytest_dflash.hostaccess.hostlock import HostLock
from pytest_dflash.hostaccess.transport import Transport

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

Runs = Callable[..., SuiteRun]
LAYERS = ("-m", "host or service or generation")


def _first_run_holding_the_lock(testhost: TestHost, guest: Guest, runs: Runs, tmp_path: Path,
                                slow_load: int) -> tuple[SuiteRun, RefUnit, str]:
    spec = RefUnit(unit_name("lock-a"), "DFLASH", f"--inject slow-load={slow_load}")
    guest.track(spec.unit)
    first = runs(write_profile(tmp_path, testhost, "first", {"dflash": spec}), "--provision", *LAYERS, name="first")

    def holds_it() -> bool:
        if first.proc is not None and first.proc.poll() is not None:
            raise AssertionError(f"the first run ended early:\n{first.output()[-3000:]}")
        return f"pid={first.pid} " in guest.lock_owner() and not guest.lock_is_free()

    guest.wait_for(holds_it, 60, "the first run to take the host lock")
    return first, spec, guest.lock_owner()


def test_second_run_waits_for_the_first_then_proceeds(testhost: TestHost, guest: Guest, runs: Runs,
                                                      tmp_path: Path) -> None:
    first, spec_a, owner = _first_run_holding_the_lock(testhost, guest, runs, tmp_path, slow_load=5)
    spec_b = RefUnit(unit_name("lock-b"), "DFLASH")
    guest.track(spec_b.unit)
    second = runs(write_profile(tmp_path, testhost, "second", {"dflash": spec_b}), "--provision", *LAYERS,
                  name="second")
    one, two = first.wait(180), second.wait(180)
    one.assert_clean()
    two.assert_clean()
    assert one.rc == 0 and two.rc == 0, (one.out[-3000:], two.out[-3000:])
    assert f"[dflash] second: waiting for another run to release the host ({owner})" in two.out

    # The second run's unit started only after the first run's unit was gone.
    end_a = max(int(e["__REALTIME_TIMESTAMP"]) / 1e6 for e in guest.journal(spec_a.unit))
    start_b = min(int(e["__REALTIME_TIMESTAMP"]) / 1e6 for e in guest.journal(spec_b.unit)
                  if str(e.get("MESSAGE", "")).startswith("Started "))
    assert end_a < start_b, f"the second run started its unit {end_a - start_b:.2f}s before the first one's was gone"
    assert guest.refservers() == [] and guest.lock_is_free()


def test_second_run_with_short_lock_wait_fails_naming_the_owner(testhost: TestHost, guest: Guest, runs: Runs,
                                                                tmp_path: Path) -> None:
    first, _, owner = _first_run_holding_the_lock(testhost, guest, runs, tmp_path, slow_load=8)
    # two services: neither may be started while another run holds the host
    units = {"one": RefUnit(unit_name("lock-one"), "DFLASH"), "two": RefUnit(unit_name("lock-two"), "NONE")}
    guest.track(*(u.unit for u in units.values()))
    second = runs(write_profile(tmp_path, testhost, "busy", units), "--provision", "--lock-wait=1s", *LAYERS,
                  name="busy").wait(120)
    second.assert_clean()
    assert second.rc == 1
    assert f"another run holds the host lock ({owner}); gave up after 1s" in second.out
    data = second.verdict("busy")
    failed = {f["test"].rsplit("::", 1)[1] for f in data["failures"]}
    assert "test_service_ready[busy/one]" in failed, data["failures"]
    assert all("another run holds the host lock" in f["message"] or f["diagnosis"] for f in data["failures"])
    assert data["layers"]["generation"]["outcome"] == "blocked"
    for spec in units.values():  # never installed, never started
        assert guest.journal(spec.unit) == [] and guest.show(spec.unit)["LoadState"] == "not-found"

    one = first.wait(180)  # the first run was not disturbed
    one.assert_clean()
    assert one.rc == 0, one.out[-3000:]
    assert guest.refservers() == [] and guest.lock_is_free()


IN_FLIGHT = """
import sys
import pytest_dflash.services.registry  # registers the service kinds a profile may name
from pytest_dflash.config.loader import load_profile
from pytest_dflash.hostaccess.transport import Transport
result = Transport(load_profile(__import__("pathlib").Path(sys.argv[1]))).run("sleep 3.217; echo survived", timeout_s=30)
print(result.rc, result.stdout.strip(), result.stderr.strip())
"""


def test_one_runs_ssh_teardown_never_cuts_another_runs_command(testhost: TestHost, guest: Guest,
                                                                tmp_path: Path) -> None:
    path = write_profile(tmp_path, testhost, "shared", {"dflash": RefUnit(unit_name("unused"))})
    other = subprocess.Popen([sys.executable, "-c", IN_FLIGHT, str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        guest.wait_for(lambda: guest.sh("pgrep -f '^sleep 3[.]217' || true").strip(), 20,
                       "the other run's command to be in flight")
        mine = Transport(load_profile(path))
        mine.ping()
        mine.close()  # what every run does at teardown
        out, _ = other.communicate(timeout=60)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait(timeout=10)
        for socket_path in Path("/tmp").glob(f"pytest-dflash-ssh-{other.pid}-*"):  # its master, never closed
            subprocess.run(["ssh", "-S", str(socket_path), "-O", "exit", "x"], capture_output=True, timeout=15,
                           check=False)
    assert out.split()[:2] == ["0", "survived"], out


def test_lock_held_elsewhere_is_reported_with_its_owner_then_taken_and_released(testhost: TestHost, guest: Guest,
                                                                                 tmp_path: Path) -> None:
    owner = "run=0ther0wner controller=elsewhere pid=4242 since=00:00:00"
    holder = unit_name("lockholder")
    guest.track(holder)
    guest.sh(f"echo '{owner}' > {REMOTE_OWNER} && systemd-run --unit={holder} flock {REMOTE_LOCK} sleep 120")
    guest.wait_for(lambda: not guest.lock_is_free(), 15, "the lock holder to take the lock")
    profile = load_profile(write_profile(tmp_path, testhost, "probe", {"dflash": RefUnit(unit_name("unused"))}))
    for _ in range(8):
        with pytest.raises(ServiceBusy, match=f"another run holds the host lock \\({owner}\\)"):
            HostLock(profile, "mine").acquire(0)
    guest.sh(f"systemctl stop {holder}")
    lock = HostLock(profile, "mine")
    lock.acquire(10)
    try:
        assert lock.held and not guest.lock_is_free() and guest.lock_owner().startswith("run=mine ")
    finally:
        lock.release()
    assert guest.lock_is_free()


def test_busy_answer_in_one_chunk_still_names_the_owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's BUSY and owner lines often arrive in one read (seen under load); the owner must not be
    lost in the reader's buffer. An `ssh` on PATH that answers both in one write makes that certain."""
    owner = "run=0ther0wner controller=elsewhere pid=4242 since=00:00:00"
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf 'BUSY\\n{owner}\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    profile = tmp_path / "far.toml"
    profile.write_text('[host]\nconnection = "ssh://root@far.invalid"\n[services.x]\nunit = "x.service"\n'
                       'algorithm = "NONE"\nport = 30000\n')
    with pytest.raises(ServiceBusy, match=f"another run holds the host lock \\({owner}\\)"):
        HostLock(load_profile(profile), "mine").acquire(0)
