"""Attach mode on a container: only reads (inspect / logs / ps / exec of probes), audited; and stale cleanup
after a SIGKILLed run removes only what this tool created."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from container_helpers import (
    GUEST_PYTHON,
    PODMAN,
    ULIMITS,
    containers_of,
    free_port,
    podman,
    refserver_command,
    remove,
    unique,
    write_profile,
)
from support.pytest_runs import assert_no_crash

from pytest_dflash.config.loader import load_profile
from pytest_dflash.errors import ReadOnlyViolation
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.services.container import ContainerService

ENGINE = r"podman --runtime runc"
NAME = r"[\w.-]+"
# What attach mode may send for a container service: engine reads, the clock, the kernel log, probes.
READ_ONLY = [re.compile(p, re.S) for p in (
    r"echo dflash-ping",
    r"date \+%s\.%N",
    rf"{ENGINE} container inspect --format '[^']*' {NAME}",
    rf"{ENGINE} logs( --since \d+\.\d+)? --tail \d+ --timestamps {NAME} 2>&1",
    r"\{ journalctl -k --no-pager 2>/dev/null; dmesg 2>/dev/null; \} \| grep -F [0-9a-f]+ \| grep -E .*",
    rf"{ENGINE} ps -a --filter label=\S+ --format '\{{\{{\.Names\}}\}}'",
    r"\(journalctl -k .*\) \| grep -E .*",
    r"printf %s [A-Za-z0-9+/=]+ \| base64 -d \| \S+(?: -S)? - .*",  # probes (the testhost audit reviews their sources)
    rf"printf %s [A-Za-z0-9+/=]+ \| base64 -d \| {ENGINE} exec -i {NAME} \S+ - .*",  # probes in a container
)]


def _run_container(name: str, port: int, image: str, *args: str) -> None:
    root = Path(__file__).resolve().parents[2]
    podman("run", "-d", "--name", name, "--label", "app=" + name, *(f"--ulimit={u}" for u in ULIMITS),
           "-p", f"{port}:{port}", "-v", f"{root}:/opt/pytest-dflash:ro", image,
           *[part.replace("{port}", str(port)) for part in refserver_command("DFLASH", args)], timeout=120)


def test_attach_sends_only_read_only_commands(run_suite, refserver_image: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Attach (no --provision) to a container by label: the audit log holds only reads; the container is
    untouched (same id, same StartedAt, still running)."""
    name, port = unique("ct-ro"), free_port()
    _run_container(name, port, refserver_image)
    try:
        before = podman("container", "inspect", "--format", "{{.Id}} {{.State.StartedAt}}", name).stdout
        host = unique("ct-attach")
        profile = write_profile(tmp_path, host, refserver_image, provision="never", port=port,
                                extra=f'label = "app={name}"')
        log = tmp_path / "commands.jsonl"
        monkeypatch.setenv("DFLASH_COMMAND_LOG", str(log))
        result = run_suite("smoke", "--host", str(profile))
        assert_no_crash(result)
        assert result.ret == 0, result.stdout.str()[-3000:]
        sent = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        assert sent, "no command was audited"
        assert not [s for s in sent if s["mutating"]], sent
        assert all(s["read_only"] for s in sent)
        unknown = [s["command"] for s in sent if not any(p.fullmatch(str(s["command"])) for p in READ_ONLY)]
        assert unknown == [], unknown
        assert any(" logs " in str(s["command"]) or "container inspect" in str(s["command"]) for s in sent)
        after = podman("container", "inspect", "--format", "{{.Id}} {{.State.StartedAt}}", name).stdout
        assert after == before
        # The guard: a read-only transport refuses `run` / `rm` before anything is sent; probes run inside.
        spec = load_profile(profile).services["dflash"]
        assert spec.container is not None
        fresh = dataclasses.replace(spec, container=dataclasses.replace(spec.container, label=None,
                                                                        name=unique("ct-never")))
        transport = Transport(load_profile(profile), read_only=True)
        with pytest.raises(ReadOnlyViolation):
            ContainerService(fresh, transport, host=host, run_id="audit").start()
        service = ContainerService(spec, transport, host=host, run_id="audit")
        facts = service.exec_probe("import json, sys; print(json.dumps({'python': sys.executable}))",
                                   python=GUEST_PYTHON)
        assert facts == {"python": GUEST_PYTHON}  # the container's own interpreter, not the host's
        with pytest.raises(ReadOnlyViolation):
            service._provisioned = True
            service.stop()
    finally:
        remove(name)


def test_stale_container_of_a_killed_run_is_removed_by_the_next(run_suite, refserver_image: str,  # type: ignore[no-untyped-def]
                                                                 tmp_path: Path) -> None:
    """SIGKILL pytest while its container runs: the container stays (nothing could clean up); the next run of
    that profile finds it by its labels and removes it, and leaves a container it did not create alone."""
    host = unique("ct-stale")
    profile = write_profile(tmp_path, host, refserver_image, args=["--inject", "slow-load=30"])
    foreign, foreign_port = unique("ct-foreign"), free_port()
    _run_container(foreign, foreign_port, refserver_image)
    root = Path(__file__).resolve().parents[2]
    try:
        victim = subprocess.Popen([sys.executable, "-m", "pytest", str(root / "suites" / "smoke"), "-p",
                                   "no:cacheprovider", "--host", str(profile), "--provision",
                                   f"--dflash-report={tmp_path / 'r1'}"], cwd=tmp_path,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 90
        while not containers_of(host):
            assert victim.poll() is None, "the first run ended before its container started"
            assert time.monotonic() < deadline, "no container appeared within 90s"
            time.sleep(0.2)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        stale = containers_of(host)
        assert len(stale) == 1
        # The next run (a healthy server this time) removes it before starting its own.
        profile = write_profile(tmp_path, host, refserver_image)
        result = run_suite("smoke", "--host", str(profile), "--provision")
        assert_no_crash(result)
        assert result.ret == 0, result.stdout.str()[-3000:]
        assert containers_of(host) == []
        assert podman("container", "exists", stale[0], check=False).returncode != 0
        assert podman("container", "exists", foreign, check=False).returncode == 0  # never one it did not create
    finally:
        remove(foreign, *containers_of(host))
        subprocess.run([*PODMAN, "ps", "-a"], capture_output=True, check=False, timeout=30)
