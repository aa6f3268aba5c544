"""A unit's journal is bytes, read over ssh as a bounded tail: a line that is not UTF-8 reaches the evidence
(journalctl --all, decoded with replacement) instead of raising in testinfra's strict decoding or showing as
"[blob data]", and a journal of megabytes is read as its last LOG_READ_BYTES.

`journalctl -u UNIT` also shows what systemd (PID 1) writes about the unit: "Stopping…", "Deactivated
successfully", "Stopped …". When those come after the unit's last line is a race (a loaded CI run lost it once);
here the unit is stopped before its journal is read, so they always do, and the tests judge the unit's own lines."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest
from remote_helpers import Guest, RefUnit, unit_name, write_profile
from testhost import TestHost

from pytest_dflash.config.loader import load_profile
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.scrub.bounds import LOG_READ_BYTES
from pytest_dflash.services.systemd import SystemdService

pytest_plugins = ["remote_fixtures"]  # guest
pytestmark = pytest.mark.testhost


def _service(tmp_path: Path, testhost: TestHost, guest: Guest, script: str) -> SystemdService:
    unit = unit_name("bytes")
    guest.track(unit)
    guest.sh(f"systemd-run --unit {unit} sh -c {shlex.quote(script + '; echo the last line; sleep 300')}")
    guest.wait_for(lambda: "the last line" in guest.sh(f"journalctl -u {unit} -n 1 --no-pager -o cat"), 30,
                   "the unit's last line in its journal")
    # systemd's own lines about the unit now follow its last line, as they did when CI read the tail late
    guest.sh(f"systemctl stop {unit}")
    guest.wait_for(lambda: "Deactivated" in guest.sh(f"journalctl -u {unit} --no-pager"), 30,
                   "systemd's 'Deactivated' line about the stopped unit")
    profile = load_profile(write_profile(tmp_path, testhost, "bytes", {"dflash": RefUnit(unit)}))
    return SystemdService(profile.services["dflash"], Transport(profile, read_only=True), host="bytes",
                          run_id="bytes", python=profile.python)


def _own_lines(log: str) -> list[str]:
    """The unit's own lines of a `journalctl -u` read: those systemd (PID 1) wrote about it are not its output."""
    return [line for line in log.splitlines() if " systemd[1]: " not in line]


def test_a_journal_line_that_is_not_utf8_is_read_with_replacement(testhost: TestHost, guest: Guest,
                                                                  tmp_path: Path) -> None:
    service = _service(tmp_path, testhost, guest, r"printf 'caf\351 served \377\376\n'")
    log = service.logs_since(None, 10)
    assert "caf\ufffd served \ufffd\ufffd" in log, log
    assert _own_lines(log)[-1].endswith("the last line"), log


def test_a_journal_of_megabytes_is_read_as_its_bounded_tail(testhost: TestHost, guest: Guest,
                                                            tmp_path: Path) -> None:
    # 5 MB in 500 lines of 10 KB (journald keeps lines up to 48 KB whole)
    service = _service(tmp_path, testhost, guest, "yes \"$(head -c 10000 /dev/zero | tr '\\0' x)\" | head -n 500")
    started = time.monotonic()
    log = service.logs_since(None, 1000)
    assert time.monotonic() - started < 20
    assert len(log.encode()) <= LOG_READ_BYTES
    assert log.startswith("[… earlier output not read: cap 4 MB per log read]\n")
    assert _own_lines(log)[-1].endswith("the last line"), log[-2000:]
