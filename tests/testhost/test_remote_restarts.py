"""Restart=on-failure units that crash and come back: systemd calls them "active", the plugin must not.

- attach mode against a unit already crash-looping with RestartSec=0: every poll finds it active
  (it is restarted within milliseconds), yet NRestarts grows: a failure, reported while active (its dying
  process may answer the readiness request with a 500 first: still reported as the restart);
- provision mode with RestartSec=1: the crash is caught during the auto-restart pause, before
  systemd restarts the unit (within 2 s of it), and teardown stops the loop.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from remote_helpers import Guest, RefUnit, Sampler, SuiteRun, render_unit, unit_name, write_profile
from testhost import TestHost

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

Runs = Callable[..., SuiteRun]
# The refserver serves for 0.1 s after binding its port, then dies (exit 1): never ready.
CRASH_LOOP = "--inject crash-after=0.1"


def test_attach_to_a_restarting_unit_fails_although_it_is_active(testhost: TestHost, guest: Guest, runs: Runs,
                                                                 tmp_path: Path) -> None:
    spec = RefUnit(unit_name("loop"), "DFLASH", CRASH_LOOP, restart="on-failure", restart_sec="0")
    guest.track(spec.unit)
    guest.install_unit(spec.unit, render_unit(spec, "dflash"))
    guest.wait_for(lambda: int(guest.show(spec.unit)["NRestarts"]) >= 1, 60, f"{spec.unit} to restart once")
    guest.wait_for(lambda: guest.is_active(spec.unit) == "active", 30, f"{spec.unit} to be active again")
    before = int(guest.show(spec.unit)["NRestarts"])
    profile = write_profile(tmp_path, testhost, "loop", {"dflash": spec})
    with Sampler(guest, spec.unit, every=0.05) as sampler:
        outcome = runs(profile, "-m", "host or service or generation").wait(120)  # attach: the default
    outcome.assert_clean()
    test = "test_service_ready[loop/dflash]"

    # systemd said "active" practically all the time (a restart takes milliseconds with RestartSec=0)
    states = [s for _, s in sampler.samples]
    assert states.count("active") >= 0.9 * len(states), states
    # Named as a restart (NRestarts grew: the usual case), or, when a poll caught the millisecond between
    # the exit and the restart, as a crash that systemd will restart: never as the symptom (a 500, a drop).
    message = next((line for line in outcome.out.splitlines()
                    if re.search(r"(^|: )Service(Restarted|Crashed): service dflash", line)), None)
    assert message is not None, outcome.out[-4000:]
    if "ServiceRestarted: " in message:
        assert "restarted 1 time(s) (NRestarts " in message and "although systemd may call it active" in message
        seen_before = int(message.split("(NRestarts ")[1].split(" ->")[0])
        # ... and it was active at the moment of the check: the evidence read right after says so (on a
        # loaded host the loop may have turned again before that read: NRestarts is at least one more)
        unit = outcome.section("service loop/dflash", test)
        assert "ActiveState=active" in unit or "SubState=auto-restart" in unit, unit
        assert int(unit.split("NRestarts=")[1].split()[0]) >= seen_before + 1, unit
    else:
        assert "exited with status 1" in message and "systemd will restart it (SubState=auto-restart)" in message
        seen_before = int(outcome.section("service loop/dflash", test).split("NRestarts=")[1].split()[0])
    assert seen_before >= before
    data = outcome.verdict("loop")
    assert [f["test"].rsplit("::", 1)[1] for f in data["failures"]] == [test]
    assert "unit-restarting" in [d["id"] for d in data["failures"][0]["diagnosis"]]
    assert data["layers"]["generation"]["outcome"] == "blocked"
    # attach mode changed nothing: the unit is still there, still looping (a loaded host may need a moment
    # for its next turn)
    assert guest.unit_file_exists(spec.unit)
    guest.wait_for(lambda: int(guest.show(spec.unit)["NRestarts"]) > seen_before, 30, f"{spec.unit} to loop on")


def test_provisioned_crash_loop_is_caught_before_the_restart(testhost: TestHost, guest: Guest, runs: Runs,
                                                             tmp_path: Path) -> None:
    spec = RefUnit(unit_name("loop1s"), "DFLASH", CRASH_LOOP, restart="on-failure", restart_sec="1")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "loop1s", {"dflash": spec})
    outcome = runs(profile, "--provision", "-m", "host or service or generation").wait(120)
    outcome.assert_clean()
    test = "test_service_ready[loop1s/dflash]"

    deadline = time.monotonic() + 10  # journald writes asynchronously: on a loaded machine the line comes late
    while not (exits := guest.exit_times(spec.unit)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert exits, "systemd never logged the unit's 'Main process exited'"
    crash = exits[0]
    delay = outcome.reported(test) - crash
    print(f"crash -> failing verdict with evidence: {delay:.2f}s")
    assert 0 <= delay <= 2.0, f"verdict {delay:.2f}s after the crash"
    # (in whichever readiness phase the 0.1 s of life ended: HTTP, or the first greedy generation)
    assert re.search(r"ServiceCrashed: service dflash died during readiness: [^\n]*: exited with status 1, "
                     r"Result=exit-code, status=1, systemd will restart it \(SubState=auto-restart\)", outcome.out)
    unit = outcome.section("service loop1s/dflash", test)
    assert "NRestarts=0" in unit and "Restart=on-failure" in unit  # caught at the first crash
    journal = outcome.section("journal loop1s/dflash since", test)
    assert "RuntimeError: TokenizerManager event loop died" in journal
    # teardown stopped the loop and removed the unit
    assert guest.show(spec.unit)["LoadState"] == "not-found"
    assert guest.refservers() == []
