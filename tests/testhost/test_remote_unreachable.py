"""An unreachable host: the host layer fails within 6 s with the ssh error and a diagnosis, every other
layer of that host is blocked (skips naming the root failure), and the run ends: no hang, no INTERNALERROR.

Two ways a host is unreachable: an address that drops packets (`unused_ip()`: ssh's connect timeout
fires) and a test host that was powered off (its network namespace answers with a reset).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from remote_helpers import Outcome, RefUnit, SuiteRun, unit_name, write_profile
from testhost import TestHost, down, exec_in_guest, leftovers, unused_ip

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

Runs = Callable[..., SuiteRun]


def _assert_host_layer_failed_fast_and_blocked_the_rest(outcome: Outcome, host: str, ssh_error: str) -> None:
    outcome.assert_clean()
    test = f"test_host_reachable[{host}]"
    took = outcome.reported(test) - outcome.started(test)
    print(f"host-layer test failed after {took:.2f}s")
    assert took <= 6.0, f"the host-layer test took {took:.1f}s"
    assert f"HostUnreachable: {host}: ssh failed: {ssh_error}" in outcome.out
    assert outcome.section("dflash diagnosis", test).startswith("[host-unreachable] the host could not be reached")
    data = outcome.verdict(host)
    assert data["verdict"] == "fail" and data["exit_code"] == 1
    assert [f["test"].rsplit("::", 1)[1] for f in data["failures"]] == [test]
    assert data["failures"][0]["diagnosis"][0]["id"] == "host-unreachable"
    assert {layer: v["outcome"] for layer, v in data["layers"].items() if v["outcome"] != "not-run"} == {
        "host": "failed", "service": "blocked", "generation": "blocked"}
    root = f"blocked: host layer failed on {host} (suites/smoke/test_smoke.py::{test}): [host-unreachable]"
    assert len(data["blocked"]) >= 4 and all(b["message"].startswith(root) for b in data["blocked"])
    assert f"BLOCKED {len(data['blocked'])} test(s): {root}" in outcome.out


def test_address_that_drops_packets(testhost: TestHost, runs: Runs, tmp_path: Path) -> None:
    address = unused_ip(testhost)
    spec = RefUnit(unit_name("blackhole"), "DFLASH")
    profile = write_profile(tmp_path, testhost, "blackhole", {"dflash": spec}, address=address)
    outcome = runs(profile, "-m", "host or service or generation").wait(60)
    _assert_host_layer_failed_fast_and_blocked_the_rest(
        outcome, "blackhole", f"ssh: connect to host {address} port 22: Connection timed out")
    assert outcome.seconds < 30, f"the whole run took {outcome.seconds:.0f}s"


def test_test_host_powered_off(testhost_factory: Callable[..., TestHost], runs: Runs, tmp_path: Path) -> None:
    th = testhost_factory()
    # power the guest off from inside; nspawn exits with it, its network namespace stays (down() removes it)
    exec_in_guest(th, "systemctl poweroff", timeout=30)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{th.nspawn_pid}").exists() and _not_zombie(th.nspawn_pid):
        assert time.monotonic() < deadline, "the guest did not power off within 60s"
        time.sleep(0.2)
    spec = RefUnit(unit_name("down"), "DFLASH")
    profile = write_profile(tmp_path, th, "down", {"dflash": spec})
    outcome = runs(profile, "--provision", "-m", "host or service or generation").wait(60)
    _assert_host_layer_failed_fast_and_blocked_the_rest(
        outcome, "down", f"ssh: connect to host {th.guest_ip} port 22: Connection refused")
    assert outcome.seconds < 30, f"the whole run took {outcome.seconds:.0f}s"
    down(th)
    # down() can return while the exited nspawn is still a zombie (this machine's PID 1 reaps about once
    # a second): wait for that, then nothing of the instance may be left.
    deadline = time.monotonic() + 10
    while leftovers(th) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(th) == []


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
