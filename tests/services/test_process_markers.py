"""Provisioning markers (services/process.py): written whole, read by a later run's reaper, which stops what a
dead run left and keeps what a live run (or another host) owns."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.files import atomic_write
from pytest_dflash.services.process import ProcessService, reap_stale


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DFLASH_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def test_a_started_service_s_marker_is_whole_and_a_later_reaper_keeps_it(tmp_path: Path, state: Path) -> None:
    """The marker a provisioned process gets is written with atomic_write: the next run's reaper reads it whole
    and keeps it while its run lives (an unreadable one it deletes, and the run's processes would outlive a
    SIGKILL of the run)."""
    spec = ServiceSpec(name="svc", kind="process", url="http://127.0.0.1:{port}", algorithm="DFLASH",
                       command=("sleep", "30"))
    service = ProcessService(spec, host="h", run_id="marker", python=sys.executable, log_dir=tmp_path)
    service.start()
    try:
        (marker,) = (state / "markers").glob("h.svc.*.json")
        assert json.loads(marker.read_text())["cmdline"] == ["sleep", "30"]
        assert stat.S_IMODE(marker.stat().st_mode) == 0o644
        assert reap_stale("h") == [] and marker.exists()
    finally:
        service.stop()
    assert not marker.exists()


def test_a_dead_runs_process_is_stopped_and_another_hosts_marker_is_left_alone(state: Path) -> None:
    """"ct200.*.json" also matches host "ct200.lab": its marker is another host's, under another lock."""
    left = subprocess.Popen(["sleep", "30"], start_new_session=True)
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        dead_owner = {"owner_pid": 2**22 + 7, "owner_start": 0, "cmdline": ["sleep", "30"], "service": "dflash"}
        atomic_write(state / "markers" / f"ct200.dflash.{left.pid}.json",
                     json.dumps({**dead_owner, "host": "ct200", "pid": left.pid, "pgid": left.pid}))
        lab = state / "markers" / f"ct200.lab.dflash.{other.pid}.json"
        atomic_write(lab, json.dumps({**dead_owner, "host": "ct200.lab", "pid": other.pid, "pgid": other.pid}))
        (done,) = reap_stale("ct200")
        assert f"stopped stale dflash (pid {left.pid})" in done
        assert left.wait(timeout=10) is not None
        assert other.poll() is None and lab.exists()
    finally:
        for proc in (left, other):
            proc.kill()
            proc.wait()
