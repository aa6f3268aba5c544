"""Services that are plain processes on this machine (the embedded refservers of hosts/local.toml).

Each started process gets its own session (process group) and a marker file recording its PID,
command line and owning run. A run killed with SIGKILL leaves the marker behind; the next run
finds it (`reap_stale`) and stops the orphan — but only if /proc still shows the same command
line, so a recycled PID is never killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_dflash.config.parallel import gpu_environment
from pytest_dflash.config.paths import state_root
from pytest_dflash.config.placeholders import render
from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.config.tables.kinds import KindTable
from pytest_dflash.config.tables.reader import Table
from pytest_dflash.documents import loads_json
from pytest_dflash.errors import ServiceError
from pytest_dflash.files import atomic_write
from pytest_dflash.scrub.bounds import LOG_READ_BYTES
from pytest_dflash.services.base import (
    Kind,
    LaunchEnvironment,
    LogMark,
    ServiceHost,
    ServiceState,
    death_from_returncode,
)
from pytest_dflash.services.derive import PlainTarget, PlainUnavailable, strip_speculative_args, with_port


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_ticks(pid: int) -> int:
    """The process start time in clock ticks since boot (tells a recycled PID from the original)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def cmdline_of(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def kill_group(pgid: int, *, grace_s: float = 10.0, reap: Callable[[float], None] | None = None) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace_s`.

    `reap` waits for our own child (the group leader) so that it does not linger as a zombie,
    which would make the group look alive.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                reap(0.05)
        if not group_members(pgid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if reap is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            reap(5.0)


@dataclass
class ProcessService:
    """A service run as a child process of this pytest run."""

    spec: ServiceSpec
    host: str
    run_id: str
    python: str
    log_dir: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)
    _proc: subprocess.Popen[bytes] | None = None
    _env: dict[str, str] | None = None  # what start() gave the process
    _port: int | None = None
    _log_path: Path | None = None
    _marker: Path | None = None
    _command: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def provisioned(self) -> bool:
        return self._proc is not None

    @property
    def url(self) -> str:
        return self.spec.url_on(self.port)

    @property
    def provisionable(self) -> bool:
        return True

    @property
    def native_api(self) -> bool | None:
        return True  # SGLang (or the refserver) by construction

    @property
    def started_env(self) -> Mapping[str, str] | None:
        return self._env

    def attach(self) -> None:
        """Nothing to read first: a process this run did not start has no state to check."""
        return None

    @property
    def port(self) -> int:
        if self._port is None:
            self._port = self.spec.port or free_port()
        return self._port

    @property
    def log_path(self) -> Path:
        if self._log_path is None:
            self._log_path = self.log_dir / f"{self.host}.{self.name}.{self.run_id}.log"
        return self._log_path

    def values(self) -> dict[str, str]:
        gpus = ",".join(str(g) for g in self.spec.gpus)
        return {"python": self.python, "port": str(self.port), "service": self.name, "host": self.host,
                "run_id": self.run_id, "gpus": gpus, "gpu": gpus.split(",")[0] if gpus else "",
                **self.spec.vars}

    def start(self) -> None:
        if self._proc is not None:
            return
        where = f"services.{self.name}.command"
        try:
            self._command = [render(part, self.values(), where=where) for part in self.spec.command]
        except ValueError as exc:
            raise ServiceError(str(exc)) from None
        env = self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env,
                           **gpu_environment(self.spec.gpus), **self.spec.env}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns the descriptor after fork
        try:
            self._proc = subprocess.Popen(
                self._command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,  # own process group: stop() can kill the whole tree
            )
        except OSError as exc:
            raise ServiceError(f"{self.host}/{self.name}: cannot start {self._command[0]!r}: {exc}") from None
        finally:
            log.close()
        self._marker = state_root() / "markers" / f"{self.host}.{self.name}.{self._proc.pid}.json"
        # atomic: a later run's reaper that read half a marker would delete it, and this run's processes
        # would outlive a SIGKILL of it
        atomic_write(self._marker, json.dumps({
            "host": self.host, "service": self.name, "pid": self._proc.pid, "pgid": self._proc.pid,
            "cmdline": self._command, "run_id": self.run_id, "owner_pid": os.getpid(),
            "owner_start": start_ticks(os.getpid()), "started": time.time(), "log": str(self.log_path),
        }))

    def stop(self) -> None:
        if self._proc is None:
            return
        proc = self._proc

        def reap(timeout: float) -> None:
            proc.wait(timeout=timeout)

        # Also when the leader already died: its children may still hold the port.
        kill_group(proc.pid, grace_s=10.0 if proc.poll() is None else 2.0, reap=reap)
        if self._marker is not None:
            self._marker.unlink(missing_ok=True)

    def state(self) -> ServiceState:
        if self._proc is None:
            return ServiceState(running=False, properties={"state": "not started"})
        returncode = self._proc.poll()
        if returncode is None:
            return ServiceState(running=True, pid=self._proc.pid)
        return ServiceState(running=False, death=death_from_returncode(returncode), pid=self._proc.pid)

    def log_mark(self) -> LogMark:
        try:
            offset = self.log_path.stat().st_size
        except OSError:
            offset = 0
        return LogMark(time.time(), offset)

    def logs_since(self, mark: LogMark | None, lines: int) -> str:
        """The last `lines` lines written since `mark`, from at most the file's last LOG_READ_BYTES (a seek:
        what a server printed before is never read), decoded with replacement."""
        try:
            with open(self.log_path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                start = mark.offset if mark and mark.offset <= size else 0
                cut = size - start > LOG_READ_BYTES
                handle.seek(max(start, size - LOG_READ_BYTES))
                data = handle.read(LOG_READ_BYTES)
        except OSError:
            return ""
        text = data.decode(errors="replace")
        if cut:  # the first line is a part of one
            text = text.partition("\n")[2]
        return "\n".join(text.splitlines()[-lines:])

    def launch_environment(self, *, live: bool) -> LaunchEnvironment:
        """The profile's command ({python} filled in) and env: what this run starts, or would."""
        argv = tuple(part.replace("{python}", self.python) for part in self.spec.command)
        return LaunchEnvironment(argv, {**gpu_environment(self.spec.gpus), **self.spec.env}, None,
                                 "profile command")

    def describe(self) -> dict[str, str]:
        info = {"kind": "process", "command": " ".join(self._command) or " ".join(self.spec.command),
                "log": str(self.log_path), "url": self.url}
        if self._proc is not None:
            info["pid"] = str(self._proc.pid)
            info["state"] = self.state().summary()
        return info


def reap_stale(host: str) -> list[str]:
    """Stop processes left behind by runs that died without cleaning up; returns what was done."""
    done: list[str] = []
    markers = state_root() / "markers"
    for marker in sorted(markers.glob(f"{host}.*.json")) if markers.is_dir() else []:
        try:
            info: dict[str, Any] = loads_json(marker.read_text())
        except (OSError, ValueError):  # UnicodeDecodeError, JSONDecodeError, DocumentTooDeep
            marker.unlink(missing_ok=True)
            continue
        if info.get("host") != host:
            continue  # the glob "ct200.*" also matches host "ct200.lab", which is another host and lock
        owner = int(info.get("owner_pid", 0))
        if owner and pid_alive(owner) and start_ticks(owner) == info.get("owner_start"):
            continue  # its run is still alive: not stale
        pid = int(info["pid"])
        if pid_alive(pid) and cmdline_of(pid) == list(info.get("cmdline", [])):
            kill_group(int(info.get("pgid", pid)), grace_s=5)
            done.append(f"stopped stale {info['service']} (pid {pid}) left by run {info.get('run_id')} "
                        f"(owner pid {info.get('owner_pid')} is gone)")
        marker.unlink(missing_ok=True)
    return done


def _make(spec: ServiceSpec, host: ServiceHost) -> ProcessService:
    return ProcessService(spec, host=host.name, run_id=host.run_id, python=host.profile.python,
                          log_dir=host.log_dir)


def _reap(host: ServiceHost, specs: list[ServiceSpec]) -> list[str]:
    """On this machine, whatever the profile's kinds: a dead run's markers are per host, not per service."""
    return reap_stale(host.name) if host.profile.is_local else []


def _derive_plain(reference: ServiceSpec, target: PlainTarget) -> ServiceSpec:
    """The reference's command line without --speculative-*, on a free port (its {port} placeholder)."""
    command = strip_speculative_args(reference.command)
    if reference.port is not None:
        command = tuple("{port}" if part == str(reference.port) else part for part in command)
    if not any("{port}" in part for part in command):
        raise PlainUnavailable(f"services.{reference.name}.command has no {{port}} placeholder to move the "
                               "plain server to a free port")
    return ServiceSpec(name=target.name, kind="process", url=with_port(reference.url, "{port}"),
                       algorithm="NONE", command=command, env=reference.env, vars=reference.vars,
                       gpus=target.gpus, port=target.port, ready_timeout_s=reference.ready_timeout_s,
                       sampled_timeout_s=reference.sampled_timeout_s, api_key_env=reference.api_key_env,
                       model=reference.model)


def _read_table(table: Table, spec: ServiceSpec, host: HostProfile, profile_dir: Path) -> ServiceSpec:
    """A process service has a command, run on this machine (the only kind that gets an automatic port)."""
    if not spec.command:
        raise table.fail("command", 'missing required key for kind = "process" (expected a list of strings)')
    if host.connection and not host.is_local:
        raise table.fail("kind", 'kind = "process" runs on this machine; use "systemd" for a remote host')
    return spec


def _default_for(host: HostProfile) -> bool:
    """The kind of a service whose table names none, on this machine (local://, or no connection)."""
    return not (host.connection and not host.is_local)


TABLE = KindTable("process", read=_read_table, default_for=_default_for, auto_port=True,
                  schema={"required": ["command"]})
KIND = Kind("process", make=_make, reap=_reap, derive_plain=_derive_plain, table=TABLE)
