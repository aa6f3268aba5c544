"""--provision against a real systemd over ssh: deploy, reload, start, ready by real generation, smoke,
teardown; a run SIGTERMed mid-way that still tears down; and a run SIGKILLed mid-way whose unit the
next run finds and removes.

Each test runs the real smoke suite through the plugin in a pytest subprocess, with a host profile
`ssh://root@<guest>` + the instance's ssh_config, and checks the guest from outside (nsenter).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from remote_helpers import UNIT_DIR, Guest, RefUnit, SuiteRun, unit_name, write_profile
from testhost import TestHost

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

Runs = Callable[..., SuiteRun]


def _commands(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_provision_deploys_starts_and_removes_units(testhost: TestHost, guest: Guest, runs: Runs,
                                                    tmp_path: Path) -> None:
    units = {"none": RefUnit(unit_name("prov-none"), "NONE"), "dflash": RefUnit(unit_name("prov-dflash"), "DFLASH")}
    guest.track(*(u.unit for u in units.values()))
    profile = write_profile(tmp_path, testhost, "prov", units, parity=("none", ["dflash"]))
    log = tmp_path / "commands.jsonl"
    outcome = runs(profile, "--provision", env={"DFLASH_COMMAND_LOG": str(log)}).wait(240)
    outcome.assert_clean()
    assert outcome.rc == 0 and "failed" not in outcome.outcomes(), outcome.out[-4000:]
    data = outcome.verdict("prov")
    assert data["verdict"] == "pass"
    assert {layer: data["layers"][layer]["outcome"] for layer in ("host", "service", "generation", "parity")} == dict.fromkeys(
        ("host", "service", "generation", "parity"), "passed")
    for name, spec in units.items():
        facts = data["services"][name]
        assert facts["provisioned"] is True and facts["algorithm"] == spec.algorithm
        ready = facts["ready"]
        assert ready["greedy_s"] is not None and ready["sampled_s"] is not None, ready  # real generations
        # the requests really reached the unit's refserver in the guest, from this machine
        journal = guest.journal_text(spec.unit)
        assert f'{testhost.host_ip}:' in journal and '"POST /generate HTTP/1.1" 200' in journal

    # What was sent, in order, for each unit: install, reload, start ... stop, remove, reload.
    sent = [str(c["command"]) for c in _commands(log)]
    for spec in units.values():
        path = f"{UNIT_DIR}/{spec.unit}"
        # write_file logs what it wrote, not the payload (which may hold secrets)
        install = next(i for i, c in enumerate(sent) if c.startswith(f"write {path} (") and "base64 | mv" in c)
        reload_after_install = sent.index("systemctl daemon-reload", install)
        start = sent.index(f"systemctl start --no-block {spec.unit}", reload_after_install)
        stop = sent.index(f"systemctl stop {spec.unit}", start)
        remove = sent.index(f"rm -f {path}", stop)
        assert "systemctl daemon-reload" in sent[remove:], "no daemon-reload after the unit file was removed"

    # The guest afterwards: no unit file, systemd no longer knows the units (so it was reloaded),
    # no refserver process, the host lock free.
    for spec in units.values():
        assert not guest.unit_file_exists(spec.unit)
        assert guest.show(spec.unit, "LoadState")["LoadState"] == "not-found"
    assert guest.refservers() == []
    assert guest.lock_is_free()


def _wait_until_active(guest: Guest, run: SuiteRun, unit: str) -> None:
    def active_or_ended() -> bool:
        if run.proc is not None and run.proc.poll() is not None:
            raise AssertionError(f"the run ended before its unit was active:\n{run.output()[-3000:]}")
        return guest.is_active(unit) == "active"

    guest.wait_for(active_or_ended, 90, f"{unit} to be active")


def test_sigterm_mid_run_still_tears_down(testhost: TestHost, guest: Guest, runs: Runs, tmp_path: Path) -> None:
    spec = RefUnit(unit_name("term"), "DFLASH")
    guest.track(spec.unit)
    run = runs(write_profile(tmp_path, testhost, "term", {"dflash": spec}), "--provision")
    _wait_until_active(guest, run, spec.unit)
    os.kill(run.pid, signal.SIGTERM)  # what CI runners and `timeout` send first
    outcome = run.wait(90)
    assert "KeyboardInterrupt: SIGTERM" in outcome.out and "INTERNALERROR" not in outcome.out, outcome.out[-3000:]
    assert not guest.unit_file_exists(spec.unit)
    assert guest.show(spec.unit, "LoadState")["LoadState"] == "not-found"
    assert guest.refservers() == []
    assert guest.lock_is_free()


@pytest.mark.heavy
def test_killed_run_leaves_a_stale_unit_that_the_next_run_removes(testhost: TestHost, guest: Guest, runs: Runs,
                                                                   tmp_path: Path) -> None:
    spec = RefUnit(unit_name("killed"), "DFLASH")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "killed", {"dflash": spec})
    first = runs(profile, "--provision", name="first")
    _wait_until_active(guest, first, spec.unit)
    first.kill()  # SIGKILL: no teardown, no atexit, no signal handler runs

    # The killed run left its unit behind, running, marked with its run id and pid.
    assert guest.is_active(spec.unit) == "active"
    marker = guest.sh(f"grep '^X-PytestDflash-Run=' {UNIT_DIR}/{spec.unit}").strip()
    stale_run = marker.partition("=")[2].split()[0]
    assert marker.endswith(f":{first.pid}"), marker
    # Its host lock died with it (the remote flock was held by its ssh session).
    guest.wait_for(guest.lock_is_free, 15, "the killed run's host lock to be released")

    second = runs(profile, "--provision", name="second").wait(240)
    second.assert_clean()
    assert second.rc == 0, second.out[-4000:]
    note = f"removed stale unit {spec.unit} left by run {stale_run}"
    assert f"note: {note}" in second.out  # the terminal summary says so
    assert any(n.startswith(note) for n in second.verdict("killed")["notes"])

    # The second run started its own unit (new run id), and tore it down: nothing is left.
    assert not guest.unit_file_exists(spec.unit)
    assert guest.show(spec.unit, "LoadState")["LoadState"] == "not-found"
    assert guest.refservers() == []
    assert guest.lock_is_free()
