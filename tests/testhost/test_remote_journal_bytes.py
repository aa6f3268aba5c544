"""A unit's journal is bytes, read over ssh as a bounded tail: a line that is not UTF-8 reaches the evidence
(journalctl --all, decoded with replacement) instead of raising in testinfra's strict decoding or showing as
"[blob data]", and a journal of megabytes is read as its last LOG_READ_BYTES."""

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
    profile = load_profile(write_profile(tmp_path, testhost, "bytes", {"dflash": RefUnit(unit)}))
    return SystemdService(profile.services["dflash"], Transport(profile, read_only=True), host="bytes",
                          run_id="bytes", python=profile.python)


def test_a_journal_line_that_is_not_utf8_is_read_with_replacement(testhost: TestHost, guest: Guest,
                                                                  tmp_path: Path) -> None:
    service = _service(tmp_path, testhost, guest, r"printf 'caf\351 served \377\376\n'")
    log = service.logs_since(None, 10)
    assert "caf\ufffd served \ufffd\ufffd" in log, log
    assert log.rstrip().endswith("the last line")


def test_a_journal_of_megabytes_is_read_as_its_bounded_tail(testhost: TestHost, guest: Guest,
                                                            tmp_path: Path) -> None:
    # 5 MB in 500 lines of 10 KB (journald keeps lines up to 48 KB whole)
    service = _service(tmp_path, testhost, guest, "yes \"$(head -c 10000 /dev/zero | tr '\\0' x)\" | head -n 500")
    started = time.monotonic()
    log = service.logs_since(None, 1000)
    assert time.monotonic() - started < 20
    assert len(log.encode()) <= LOG_READ_BYTES
    assert log.startswith("[… earlier output not read: cap 4 MB per log read]\n")
    assert log.rstrip().endswith("the last line")
