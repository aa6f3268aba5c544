"""A container's log is bytes, read as a bounded tail: `podman logs` of a container that prints Latin-1 and
megabytes, read by the container service as a run reads it (no image needed: the test host's rootfs, mounted
copy-on-write, read-only)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from container_helpers import ULIMITS, free_port, podman, remove, unique

from pytest_dflash.config.loader import load_profile
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.scrub.bounds import LOG_READ_BYTES
from pytest_dflash.services.container import ContainerService


def _container(name: str, script: str, rootfs: Path) -> None:
    podman("run", "-d", "--name", name, *(f"--ulimit={u}" for u in ULIMITS), "--read-only", "--rootfs",
           f"{rootfs}:O", "sh", "-c", f"{script}; echo 'the last line'; sleep 300", timeout=120)
    deadline = time.monotonic() + 60
    while "the last line" not in podman("logs", "--tail", "1", name).stdout:
        assert time.monotonic() < deadline, "the container never printed its last line"
        time.sleep(0.2)


def _service(tmp_path: Path, name: str) -> ContainerService:
    profile = tmp_path / "ct.toml"
    profile.write_text(f'[host]\nconnection = "local://"\npython = "{sys.executable}"\nprovision = "never"\n\n'
                       f'[services.dflash]\nkind = "container"\nengine = "podman"\nruntime = "runc"\n'
                       f'container = "{name}"\nalgorithm = "DFLASH"\nport = {free_port()}\n')
    loaded = load_profile(profile)
    return ContainerService(loaded.services["dflash"], Transport(loaded, read_only=True), host="ct", run_id="logs")


def test_a_container_log_that_is_not_utf8_is_read_with_replacement(testhost_rootfs: Path, tmp_path: Path) -> None:
    name = unique("ct-latin1")
    try:
        _container(name, r"printf 'caf\351 served \377\376\n'", testhost_rootfs)
        log = _service(tmp_path, name).logs_since(None, 10)
    finally:
        remove(name)
    assert "caf\ufffd served \ufffd\ufffd" in log, log
    assert log.rstrip().endswith("the last line")


def test_a_container_log_of_megabytes_is_read_as_its_bounded_tail(testhost_rootfs: Path, tmp_path: Path) -> None:
    name = unique("ct-megabytes")
    try:
        # 5 MB in 500 lines of 10 KB (podman logs takes seconds per 100,000 lines)
        _container(name, "yes \"$(head -c 10000 /dev/zero | tr '\\0' x)\" | head -n 500", testhost_rootfs)
        log = _service(tmp_path, name).logs_since(None, 10**6)
    finally:
        remove(name)
    assert len(log.encode()) <= LOG_READ_BYTES
    assert log.startswith("[… earlier output not read: cap 4 MB per log read]\n")
    assert log.rstrip().endswith("the last line")
