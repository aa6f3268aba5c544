"""A host-side lock so that two runs never provision the same host at once.

Local host: fcntl.flock on a file in the state dir (released by the kernel if the run dies).
Remote host: `flock` held by a long-lived ssh session whose remote side waits on stdin; when this
run exits — even by SIGKILL — ssh dies, the remote `cat` sees EOF and the lock is released.
(testinfra cannot hold a process open, so this one uses the ssh client directly, with the same
connect timeout and keep-alive options as the transport.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shlex
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from pytest_dflash import interrupts
from pytest_dflash.config.paths import state_root
from pytest_dflash.config.profiles import HostProfile
from pytest_dflash.errors import HostUnreachable, ServiceBusy
from pytest_dflash.hostaccess.transport import SSH_OPTIONS, audit_command

REMOTE_LOCK = "/run/lock/pytest-dflash.lock"
REMOTE_OWNER = "/run/lock/pytest-dflash.owner"


def _owner_line(run_id: str) -> str:
    return (f"run={run_id} controller={socket.gethostname()} pid={os.getpid()} "
            f"since={time.strftime('%H:%M:%S')}")


@dataclass
class HostLock:
    profile: HostProfile
    run_id: str
    _file: IO[str] | None = None
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None or (self._proc is not None and self._proc.poll() is None)

    def acquire(self, wait_s: float, on_wait: Callable[[str], None] | None = None) -> None:
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            interrupts.raise_if_lost()
            owner = self._try()
            if owner is None:
                return
            if time.monotonic() > deadline:
                raise ServiceBusy(f"{self.profile.name}: another run holds the host lock ({owner}); "
                                  f"gave up after {wait_s:.0f}s")
            if not announced and on_wait:
                on_wait(f"{self.profile.name}: waiting for another run to release the host ({owner})")
                announced = True
            time.sleep(1.0)

    def _try(self) -> str | None:
        """None if acquired, else a description of the current owner."""
        if self.profile.is_local:
            return self._try_local()
        return self._try_remote()

    def _try_local(self) -> str | None:
        path = state_root() / "locks" / f"{self.profile.name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 - held open for the whole run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown owner"
            handle.close()
            return owner
        handle.seek(0)
        handle.truncate()
        handle.write(_owner_line(self.run_id))
        handle.flush()
        self._file = handle
        return None

    def _ssh_command(self, remote: str) -> list[str]:
        parsed = urllib.parse.urlparse(self.profile.connection or "")
        cmd = ["ssh", *shlex.split(SSH_OPTIONS), "-o", f"ConnectTimeout={self.profile.connect_timeout_s:g}"]
        if self.profile.ssh_config:
            cmd += ["-F", self.profile.ssh_config]
        if self.profile.ssh_identity_file:
            cmd += ["-i", self.profile.ssh_identity_file]
        if parsed.port:
            cmd += ["-p", str(parsed.port)]
        target = f"{parsed.username}@{parsed.hostname}" if parsed.username else str(parsed.hostname)
        return [*cmd, target, remote]

    def _try_remote(self) -> str | None:
        # The owner line is quoted once for the inner `sh -c` script, which is quoted again as one word.
        holder = f"echo {shlex.quote(_owner_line(self.run_id))} > {REMOTE_OWNER}; echo LOCKED; exec cat"
        remote = (f"flock -n {REMOTE_LOCK} sh -c {shlex.quote(holder)}"
                  f" || {{ echo BUSY; cat {REMOTE_OWNER} 2>/dev/null; }}")
        audit_command(self.profile.name, False, remote, mutating=True)
        proc = subprocess.Popen(self._ssh_command(remote), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        ready, _, _ = select.select([proc.stdout], [], [], self.profile.connect_timeout_s + 10)
        first = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if first == "LOCKED":
            self._proc = proc
            return None
        proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
            return "no answer from the host while taking the lock"
        # Read the rest through the buffered reader that readline() used: it may already hold the owner
        # line that came in the same chunk as BUSY (communicate() would read around it, from the raw pipe).
        rest = proc.stdout.read().decode(errors="replace").strip()
        err = proc.stderr.read().decode(errors="replace").strip()
        if first == "BUSY":
            return rest or "unknown owner"
        raise HostUnreachable(f"{self.profile.name}: cannot take the host lock: "
                              f"{err or first or 'ssh failed'}")

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self._proc is not None:
            with contextlib.suppress(OSError):
                assert self._proc.stdin is not None
                self._proc.stdin.close()  # remote cat sees EOF, flock exits, the lock is free
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None
