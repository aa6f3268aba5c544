"""--provision as an unprivileged ssh user (`[host] become = true`): what needs root goes through `sudo -n`.

The guest has two such users (build.sh): `dflash` (NOPASSWD sudo, in systemd-journal) and `dflash-pw`
(sudo rights that ask for a password). Real ssh, real sudo, real systemd; the guest is checked from
outside the plugin (nsenter), and sudo's own journal lines prove what ran as root.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from remote_helpers import REMOTE_LOCK, UNIT_DIR, Guest, RefUnit, SuiteRun, unit_name, write_profile
from testhost import TestHost

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

Runs = Callable[..., SuiteRun]
LAYERS = ("-m", "host or service or generation")
SUDO_CHECK = "sudo -n -u root -- true"


def _commands(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def _sudo_lines(guest: Guest, since: float) -> str:
    """What sudo itself logged in the guest (one line per command it ran as root)."""
    return guest.sh(f"journalctl _COMM=sudo --since @{since:.3f} --no-pager -o cat", check=False)


def _wait_until_active(guest: Guest, run: SuiteRun, unit: str) -> None:
    def active_or_ended() -> bool:
        if run.proc is not None and run.proc.poll() is not None:
            raise AssertionError(f"the run ended before its unit was active:\n{run.output()[-3000:]}")
        return guest.is_active(unit) == "active"

    guest.wait_for(active_or_ended, 60, f"{unit} to be active")


def test_become_provisions_and_removes_the_stale_unit_of_a_killed_run(testhost: TestHost, guest: Guest, runs: Runs,
                                                                      tmp_path: Path) -> None:
    spec = RefUnit(unit_name("become"), "DFLASH")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "become", {"dflash": spec}, user="dflash", become=True)
    since = time.time()

    # A first run, SIGKILLed once its unit is up: the unit file was written and started through sudo.
    first = runs(profile, "--provision", *LAYERS, name="first")
    _wait_until_active(guest, first, spec.unit)
    first.kill()
    assert guest.is_active(spec.unit) == "active"
    owner = guest.sh(f"stat -c %U {UNIT_DIR}/{spec.unit}").strip()
    assert owner == "root", owner  # written as root (sudo), not as the ssh user
    stale_run = guest.sh(f"grep '^X-PytestDflash-Run=' {UNIT_DIR}/{spec.unit}").strip().partition("=")[2].split()[0]
    guest.wait_for(guest.lock_is_free, 15, "the killed run's host lock to be released")

    # The next run (same unprivileged user) stops and removes it, then provisions, serves and tears down its own.
    log = tmp_path / "commands.jsonl"
    second = runs(profile, "--provision", *LAYERS, name="second", env={"DFLASH_COMMAND_LOG": str(log)}).wait(120)
    second.assert_clean()
    assert second.rc == 0 and "failed" not in second.outcomes(), second.out[-4000:]
    assert f"note: removed stale unit {spec.unit} left by run {stale_run}" in second.out
    data = second.verdict("become")
    assert data["failures"] == [] and data["verdict"] == "partial"  # partial: only the layers selected by -m ran
    assert {layer: data["layers"][layer]["outcome"] for layer in ("host", "service", "generation")} == dict.fromkeys(
        ("host", "service", "generation"), "passed")
    ready = data["services"]["dflash"]["ready"]
    assert ready["greedy_s"] is not None and ready["sampled_s"] is not None, ready  # real generations

    sent = _commands(log)
    assert sent, "no command was logged"
    assert {c["command"] for c in sent if c.get("become")} >= {SUDO_CHECK, "systemctl daemon-reload",
                                                                f"systemctl start --no-block {spec.unit}",
                                                                f"systemctl stop {spec.unit}",
                                                                f"rm -f {UNIT_DIR}/{spec.unit}"}
    assert [c["command"] for c in sent].count(SUDO_CHECK) == 1  # checked once per run, not per command
    # every state-changing command went through sudo (but the host lock, a flock the user takes itself);
    # the state and journal reads did not
    changes = [c for c in sent if c["mutating"] and not str(c["command"]).startswith(f"flock -n {REMOTE_LOCK} ")]
    assert changes and all(c.get("become") == "root" for c in changes), changes
    reads = [c for c in sent if str(c["command"]).startswith(("systemctl show", "journalctl"))]
    assert reads and not any(c.get("become") for c in reads)
    sudo = _sudo_lines(guest, since)
    assert "dflash : " in sudo and "USER=root" in sudo and f"systemctl start --no-block {spec.unit}" in sudo, sudo

    assert not guest.unit_file_exists(spec.unit)
    assert guest.show(spec.unit, "LoadState")["LoadState"] == "not-found"
    assert guest.refservers() == []
    assert guest.lock_is_free()


def test_become_crash_is_caught_with_the_journal_read_as_the_user(testhost: TestHost, guest: Guest, runs: Runs,
                                                                  tmp_path: Path) -> None:
    spec = RefUnit(unit_name("become-crash"), "DFLASH", "--inject missing-soundfile")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "becomecrash", {"dflash": spec}, user="dflash", become=True)
    log = tmp_path / "commands.jsonl"
    outcome = runs(profile, "--provision", *LAYERS, env={"DFLASH_COMMAND_LOG": str(log)}).wait(90)
    outcome.assert_clean()
    test = "test_service_ready[becomecrash/dflash]"
    assert "ServiceCrashed: service dflash died during readiness" in outcome.out, outcome.out[-4000:]
    journal = outcome.section("journal becomecrash/dflash since", test)
    assert "ModuleNotFoundError: No module named 'soundfile'" in journal
    assert "Main process exited, code=exited, status=1/FAILURE" in journal
    assert outcome.section("dflash diagnosis", test).startswith("[soundfile-missing]")
    journal_reads = [c for c in _commands(log) if str(c["command"]).startswith("journalctl -u")]
    assert journal_reads and not any(c.get("become") for c in journal_reads)  # systemd-journal group, no sudo
    assert outcome.verdict("becomecrash")["verdict"] == "fail"
    assert not guest.unit_file_exists(spec.unit)  # torn down through sudo all the same
    assert guest.show(spec.unit, "LoadState")["LoadState"] == "not-found"


def test_sudo_that_wants_a_password_fails_at_once_with_one_line(testhost: TestHost, guest: Guest, runs: Runs,
                                                                tmp_path: Path) -> None:
    spec = RefUnit(unit_name("become-pw"), "DFLASH")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "becomepw", {"dflash": spec}, user="dflash-pw", become=True)
    log = tmp_path / "commands.jsonl"
    outcome = runs(profile, "--provision", *LAYERS, env={"DFLASH_COMMAND_LOG": str(log)}).wait(60)
    outcome.assert_clean()
    print(f"run with a password-asking sudo ended in {outcome.seconds:.1f}s")
    assert outcome.seconds < 30, f"{outcome.seconds:.1f}s"
    message = ("becomepw: become = true, but `sudo -n -u root` failed for dflash-pw (sudo: a password is required): "
               "dflash-pw needs passwordless sudo to root (a NOPASSWD rule in /etc/sudoers.d)")
    assert message in outcome.out, outcome.out[-4000:]
    data = outcome.verdict("becomepw")
    assert data["verdict"] == "fail"
    sent = _commands(log)
    # sudo was asked once, answered at once, and nothing was sent as root after it
    checks = [c for c in sent if c["command"] == SUDO_CHECK]
    assert len(checks) == 1 and checks[0]["rc"] == 1 and float(str(checks[0]["duration_s"])) < 5, checks
    assert not [c for c in sent if c.get("become") and c["command"] != SUDO_CHECK]
    assert not [c for c in sent if str(c["command"]).startswith("write ")]
    assert not guest.unit_file_exists(spec.unit)
    assert guest.lock_is_free()
