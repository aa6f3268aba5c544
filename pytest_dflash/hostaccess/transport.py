"""Running commands on a host through pytest-testinfra, with a deadline on every command.

testinfra has no per-command timeout (pytest-dev/pytest-testinfra#716), so every command is wrapped
in coreutils `timeout` on the host, ssh gets ConnectTimeout and ServerAlive options (a connection
that stalls mid-command dies), and a local watchdog thread is the last line of defence.

What a command prints is bytes: it is decoded here as UTF-8 with replacement (testinfra's own decoding is
strict: one Latin-1 byte in a log raised UnicodeDecodeError). A log is read with `read_tail`: the command's
stdout and stderr through `tail -c LOG_READ_BYTES` where it runs (scrub/bounds.py, 4 MB), so what this process
holds does not grow with what the command prints.

Attach mode builds a read-only transport: a command declared `mutating=True` raises
`ReadOnlyViolation` before anything is sent. Every command sent is logged (`Transport.sent`).

Non-root hosts (`[host] become = true`): a command that needs root — every `mutating=True` one, and
a read-only one declared `root=True` (container engine commands) — runs as
`timeout … sudo -n -u <become_user> -- sh -c …`, here and nowhere else. The first such command is
preceded by one `sudo -n -u <user> -- true`: a sudo that wants a password fails it at once (`-n`), and
every root command of the run then raises the same one-line error without being sent. (testinfra's
own sudo support — `host.sudo()`, `?sudo=true` — is not used: it runs `sudo` without `-n`, which
waits for a password, and `host.sudo()` flips shared backend state under concurrent threads.)
Everything else (systemctl show, journalctl -u, cat of a unit file) runs as the ssh user.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_dflash.config.profiles import HostProfile
from pytest_dflash.documents import loads_json
from pytest_dflash.errors import HostUnreachable, ReadOnlyViolation, TransportError
from pytest_dflash.scrub.bounds import LOG_READ_BYTES, human
from pytest_dflash.scrub.redact import redact

# ssh: fail a dead connection within ~6 s instead of hanging on it forever.
SSH_OPTIONS = "-o BatchMode=yes -o ServerAliveInterval=2 -o ServerAliveCountMax=3 -o LogLevel=ERROR"
# Multiplexing makes repeated commands (readiness polls) cost one round trip. Passed through
# ssh_extra_args, which testinfra %-escapes (its `controlpath` argument is not escaped: %C breaks it).
# One master per pytest process: `close()` ends it, and must never end the master of another run
# (two runs against one host, xdist workers) under that run's in-flight commands.
CONTROL_PATH = "/tmp/pytest-dflash-ssh-{pid}-%C"
KILL_GRACE_S = 5
# The sudo check before the first root command (sudo -n answers at once, or not at all: a stuck NSS/PAM)
BECOME_CHECK_TIMEOUT_S = 10
# journalctl --since windows start this much before their mark (on top of the clock uncertainty).
JOURNAL_SLACK_S = 0.05
# The exit status of a log command, printed after its output into the same `tail -c` (read_tail).
_EXIT_MARK = "dflash-log-read-exit="


def decode(data: bytes) -> str:
    """What a host printed, as text: UTF-8, every byte that is not replaced by U+FFFD (never an error)."""
    return data.decode("utf-8", "replace")


def control_path() -> str:
    """This process's ssh ControlPath (a SIGKILLed run's master exits on its own after ControlPersist)."""
    return CONTROL_PATH.format(pid=os.getpid())


@dataclass(frozen=True)
class CommandResult:
    command: str
    rc: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def tail(self, lines: int = 20) -> str:
        text = (self.stderr or self.stdout).strip().splitlines()
        return "\n".join(text[-lines:])


@dataclass(frozen=True)
class _Output:
    """What a command left, as bytes (decoded by the caller, never by testinfra)."""

    rc: int
    stdout: bytes
    stderr: bytes


@dataclass
class SentCommand:
    command: str
    mutating: bool
    rc: int | None = None
    duration_s: float = 0.0
    become: str | None = None  # the user it ran as through `sudo -n -u` (None: as the ssh user)


@dataclass
class Transport:
    """Runs commands on one host. No call can hang the run."""

    profile: HostProfile
    read_only: bool = False
    sent: list[SentCommand] = field(default_factory=list)
    _host: Any = None
    _unreachable: HostUnreachable | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _clock_offset: float | None = None
    _clock_error: float = 0.0
    _become_lock: threading.Lock = field(default_factory=threading.Lock)
    _become_checked: bool = False
    _become_error: TransportError | None = None

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def is_local(self) -> bool:
        return self.profile.is_local

    @property
    def timeout_s(self) -> float:
        return self.profile.command_timeout_s

    def _testinfra_host(self) -> Any:
        if self._host is None:
            import testinfra

            if self.profile.connection is None:
                raise TransportError(f"{self.name}: no host access (attached by URL only)")
            kwargs: dict[str, Any] = {}
            if not self.is_local:
                kwargs["ssh_extra_args"] = f"{SSH_OPTIONS} -o ControlPath={control_path()}"
                if self.profile.ssh_config:
                    kwargs["ssh_config"] = str(self.profile.ssh_config)
                if self.profile.ssh_identity_file:
                    kwargs["ssh_identity_file"] = str(self.profile.ssh_identity_file)
            self._host = testinfra.get_host(self.profile.connection, **kwargs)
        return self._host

    def run(
        self,
        command: str,
        *args: str,
        timeout_s: float | None = None,
        mutating: bool = False,
        root: bool | None = None,
        env: Mapping[str, str] | None = None,
        shown: str | None = None,
    ) -> CommandResult:
        """Run `command` (with shell-quoted `args` substituted for %s) on the host, within `timeout_s`.

        `root`: the command needs root (default: `mutating`); on a `become = true` host it runs through
        `sudo -n`. `shown` replaces the command text in the audit log and messages (e.g. a file payload).
        What it printed is decoded as UTF-8 with replacement: never an error, whatever the bytes."""
        text = command % tuple(shlex.quote(a) for a in args) if args else command
        entry, raw = self._send(text, timeout_s=timeout_s, mutating=mutating, root=root, env=env, shown=shown)
        return CommandResult(entry.command, raw.rc, decode(raw.stdout), decode(raw.stderr), entry.duration_s)

    def read_tail(self, command: str, *, timeout_s: float | None = None, root: bool | None = None,
                  limit: int = LOG_READ_BYTES) -> CommandResult:
        """Run a command that prints a log (its stdout and stderr together) and bring back only the last
        `limit` bytes of what it printed: `tail -c` cuts them where the command runs, so this process holds
        at most `limit` bytes whatever the command prints (400 MB of `yes`, a 10 GB file). The text is
        decoded with replacement; a tail that was cut starts at its first whole line, after a line saying
        so. `rc` is the command's own exit status (carried past the pipe after its output). The audit log
        records `command` as the caller wrote it: the wrapper only cuts its output and reads its status."""
        # The command in a subshell: an `exit` in it ends it, not the printf of its status.
        script = (f"{{ ( {command}\n) 2>&1; printf '\\n{_EXIT_MARK}%s\\n' \"$?\"; }} "
                  f"| tail -c {int(limit)}")
        entry, raw = self._send(script, timeout_s=timeout_s, mutating=False, root=root, env=None,
                                shown=command)
        data, mark, status = raw.stdout.rpartition(b"\n" + _EXIT_MARK.encode())
        if not mark:  # the shell failed before the command ran: what it said
            data, status = raw.stdout, b""
        rc = int(status) if status.strip().isdigit() else raw.rc
        text = decode(data)
        if len(raw.stdout) >= limit:  # cut: the first line is a part of one
            whole = text.partition("\n")[2]
            text = f"[… earlier output not read: cap {human(limit)} per log read]\n{whole}"
        return CommandResult(entry.command, rc, text, decode(raw.stderr), entry.duration_s)

    def _send(self, text: str, *, timeout_s: float | None, mutating: bool, root: bool | None,
              env: Mapping[str, str] | None, shown: str | None) -> tuple[SentCommand, _Output]:
        if mutating and self.read_only:
            refused = redact(shown or text)
            raise ReadOnlyViolation(f"{self.name}: attach mode refuses a state-changing command: {refused}")
        if self._unreachable is not None:
            raise self._unreachable
        limit = timeout_s or self.timeout_s
        become = (self.profile.become_user if self.profile.become and (mutating if root is None else root)
                  else None)
        if become is not None:
            self._check_become()
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        inner = f"env {prefix} sh -c {shlex.quote(text)}" if prefix else f"sh -c {shlex.quote(text)}"
        wrapped = f"timeout -k {KILL_GRACE_S} {limit:g} {_sudo(become)}{inner}"
        entry = SentCommand(redact(shown or text), mutating, become=become)
        self.sent.append(entry)
        started = time.monotonic()
        try:
            raw = self._call_with_watchdog(wrapped, limit + KILL_GRACE_S + self.profile.connect_timeout_s + 5)
            entry.rc = raw.rc
        finally:
            entry.duration_s = time.monotonic() - started
            audit_command(self.name, self.read_only, entry.command, mutating=entry.mutating, rc=entry.rc,
                          duration_s=entry.duration_s, become=become)
        if raw.rc == 124:
            raise TransportError(f"{self.name}: command timed out after {limit:g}s: {_short(entry.command)}")
        return entry, raw

    def _check_become(self) -> None:
        """Once per transport, before its first root command: `sudo -n` works for the ssh user, or a
        one-line error (cached: later root commands raise it without being sent)."""
        with self._become_lock:
            if self._become_error is not None:
                raise self._become_error
            if self._become_checked:
                return
            user = self.profile.become_user
            probe = f"{_sudo(user)}true"
            entry = SentCommand(probe, mutating=False, become=user)
            self.sent.append(entry)
            started = time.monotonic()
            try:
                raw = self._call_with_watchdog(f"timeout -k {KILL_GRACE_S} {BECOME_CHECK_TIMEOUT_S} {probe}",
                                               BECOME_CHECK_TIMEOUT_S + KILL_GRACE_S
                                               + self.profile.connect_timeout_s + 5)
                entry.rc = raw.rc
            finally:
                entry.duration_s = time.monotonic() - started
                audit_command(self.name, self.read_only, probe, mutating=False, rc=entry.rc,
                              duration_s=entry.duration_s, become=user)
            if raw.rc == 0:
                self._become_checked = True
                return
            said = " ".join(decode(raw.stderr or raw.stdout).split()) or f"exit {raw.rc}"
            if raw.rc == 124:
                said = f"no answer within {BECOME_CHECK_TIMEOUT_S}s"
            login = urllib.parse.urlparse(self.profile.connection or "").username or "the ssh user"
            self._become_error = TransportError(
                f"{self.name}: become = true, but `sudo -n -u {user}` failed for {login} "
                f"({_short(said, 200)}): {login} needs passwordless sudo to {user} (a NOPASSWD rule in "
                f"/etc/sudoers.d)"
            )
            raise self._become_error

    def _call_with_watchdog(self, wrapped: str, deadline_s: float) -> _Output:
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["result"] = self._testinfra_host().run(wrapped)
            except BaseException as exc:  # re-raised in the caller's thread
                outcome["error"] = exc

        worker = threading.Thread(target=call, name=f"transport-{self.name}", daemon=True)
        worker.start()
        worker.join(deadline_s)
        if worker.is_alive():
            raise TransportError(f"{self.name}: no answer within {deadline_s:.0f}s (connection stalled)")
        if "error" in outcome:
            raise self._translate(outcome["error"])
        result = outcome["result"]
        # testinfra decodes strictly (one byte of Latin-1 in a log raised UnicodeDecodeError): its bytes.
        return _Output(result.rc, result.stdout_bytes, result.stderr_bytes)

    def _translate(self, exc: BaseException) -> BaseException:
        # testinfra's ssh backend raises RuntimeError(CommandResult) when ssh itself exits 255.
        if isinstance(exc, RuntimeError) and exc.args and hasattr(exc.args[0], "stderr"):
            stderr = decode(getattr(exc.args[0], "stderr_bytes", b"") or b"").strip()
            error = HostUnreachable(f"{self.name}: ssh failed: "
                                    f"{stderr.splitlines()[-1] if stderr else 'exit 255'}")
            if _is_connect_failure(stderr):
                with self._lock:
                    self._unreachable = error  # do not pay the connect timeout again for every command
            return error
        if isinstance(exc, TransportError | ReadOnlyViolation):
            return exc
        if isinstance(exc, Exception):
            return TransportError(f"{self.name}: {type(exc).__name__}: {exc}")
        return exc

    def check(self, command: str, *args: str, **kwargs: Any) -> str:
        """Run and return stdout; a non-zero exit is a TransportError carrying stderr."""
        result = self.run(command, *args, **kwargs)
        if not result.ok:
            raise TransportError(f"{self.name}: `{_short(result.command)}` exited {result.rc}: "
                                 f"{result.tail(5)}")
        return result.stdout

    def ping(self) -> float:
        """Round-trip a trivial command; returns seconds. Raises HostUnreachable/TransportError."""
        started = time.monotonic()
        out = self.check("echo dflash-ping", timeout_s=10)
        if "dflash-ping" not in out:
            raise TransportError(f"{self.name}: unexpected output from echo: {out[:200]!r}")
        return time.monotonic() - started

    def clock_offset(self) -> float:
        """host clock - local clock, in seconds (for journalctl --since windows)."""
        if self._clock_offset is None:
            if self.is_local:
                self._clock_offset, self._clock_error = 0.0, 0.0
            else:
                before = time.time()
                remote = float(self.check("date +%s.%N", timeout_s=10).strip())
                after = time.time()
                self._clock_offset = remote - (before + after) / 2
                self._clock_error = (after - before) / 2
        return self._clock_offset

    @property
    def clock_error_s(self) -> float:
        """How far `clock_offset()` can be off: half the round trip it was measured with (0 until
        measured)."""
        return self._clock_error

    def write_file(self, path: str, content: str, *, mode: str = "0644") -> None:
        """Create or replace a file on the host (atomic rename; state-changing)."""
        payload = base64.b64encode(content.encode()).decode()
        tmp = f"{path}.dflash-tmp"
        self.check(
            f"printf %s {payload} | base64 -d > {shlex.quote(tmp)} && chmod {mode} {shlex.quote(tmp)} "
            f"&& mv -f {shlex.quote(tmp)} {shlex.quote(path)}",
            mutating=True,
            # the payload may hold secrets (a unit's Environment=): log what was done, not the bytes
            shown=f"write {path} ({len(content.encode())} bytes, mode {mode}; base64 | mv)",
        )

    def run_python(
        self,
        source: str,
        args: Sequence[str] = (),
        *,
        python: str | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        site: bool = True,
    ) -> CommandResult:
        """Run a Python script (sent inline, nothing written to disk) with the host's python; `site=False`
        (`python -S`) for a stdlib-only script: no site-packages scan at start-up, which in a large serving
        venv (its .pth files) is most of the interpreter's start-up time."""
        payload = base64.b64encode(source.encode()).decode()
        interpreter = shlex.quote(python or self.profile.python) + ("" if site else " -S")
        argv = " ".join(shlex.quote(a) for a in args)
        return self.run(f"printf %s {payload} | base64 -d | {interpreter} - {argv}", timeout_s=timeout_s,
                        env=env)

    def probe(self, source: str, args: Sequence[str] = (), **kwargs: Any) -> dict[str, Any]:
        """Run a probe script that prints one JSON object as its last stdout line."""
        result = self.run_python(source, args, **kwargs)
        return parse_probe_output(result, host=self.name)

    def close(self) -> None:
        """Close the ssh control master, if one was opened."""
        if self._host is not None and not self.is_local and self._unreachable is None:
            import subprocess

            backend = self._host.backend
            cmd = ["ssh", "-o", f"ControlPath={control_path()}", "-O", "exit", backend.host.name]
            if backend.host.user:
                cmd[1:1] = ["-o", f"User={backend.host.user}"]
            if backend.host.port:
                cmd[1:1] = ["-o", f"Port={backend.host.port}"]
            if self.profile.ssh_config:
                cmd[1:1] = ["-F", str(self.profile.ssh_config)]
            # On timeout the master dies on its own after ControlPersist.
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(cmd, capture_output=True, timeout=10, check=False)


def audit_command(host: str, read_only: bool, command: str, *, mutating: bool, rc: int | None = None,
                  duration_s: float | None = None, become: str | None = None) -> None:
    """Append a command sent to a host to $DFLASH_COMMAND_LOG (JSON lines), so a run can prove what it sent.

    Everything that reaches a host goes through here: the transport's commands and the host lock's ssh
    session."""
    path = os.environ.get("DFLASH_COMMAND_LOG")
    if not path:
        return
    record = {"host": host, "read_only": read_only, "mutating": mutating, "command": command, "rc": rc,
              "duration_s": None if duration_s is None else round(duration_s, 3), "time": time.time()}
    if become is not None:
        record["become"] = become  # run through `sudo -n -u <become>`
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def parse_probe_output(result: CommandResult, *, host: str) -> dict[str, Any]:
    """The last JSON object line of a probe's stdout; a clear error when there is none."""
    for line in reversed(result.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = loads_json(line)
            except ValueError:  # JSONDecodeError, DocumentTooDeep
                break
            if isinstance(value, dict):
                return value
    detail = result.tail(15) or "(no output)"
    raise TransportError(f"{host}: probe printed no JSON (exit {result.rc}):\n{detail}")


def _is_connect_failure(stderr: str) -> bool:
    markers = ("Connection timed out", "No route to host", "Connection refused", "Could not resolve hostname",
               "Network is unreachable", "Permission denied", "Host key verification failed",
               "Connection closed by", "kex_exchange_identification", "Operation timed out")
    return any(marker in stderr for marker in markers)


def journal_since(host_time: float, error_s: float = 0.0) -> str:
    """`--since @T` for journalctl (fractional seconds: systemd parses them) a hair before `host_time`.

    journald stamps an entry when it receives it, never before it was written, so a line stamped
    before `host_time` (less the clock uncertainty) was written before it: it is outside the window."""
    return f"--since @{host_time - error_s - JOURNAL_SLACK_S:.3f}"


def _sudo(user: str | None) -> str:
    """The `sudo -n` prefix of a root command on a `become = true` host ("" when not becoming)."""
    return f"sudo -n -u {shlex.quote(user)} -- " if user is not None else ""


def _short(command: str, limit: int = 160) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


def ssh_target(profile: HostProfile) -> str:
    """user@host[:port] from the profile's connection (for messages)."""
    parsed = urllib.parse.urlparse(profile.connection or "")
    return parsed.netloc or profile.name
