"""A service reached only by URL (--attach, or kind = "external"): its state is read over HTTP.

Its state is unknown (`running=None`), which tells readiness and `check_alive` to read death and silence
over HTTP instead (services/liveness.py: `HttpLiveness`).

Its log comes from where the profile says, through the host's (read-only in attach mode) transport with a
deadline, and is used for evidence, diagnosis and redaction like a journal:
`log_command = "kubectl logs deploy/sglang --since-time={since}"` ({since}: RFC 3339 UTC, {since_unix}:
seconds, {lines}: the tail length; only the last `lines` lines are kept), or `log_file = "/var/log/x.log"`
(read from the byte offset the test started at). Either is read as bytes, only its last LOG_READ_BYTES
(scrub/bounds.py; cut by `tail -c` where it is read, so memory does not grow with what it prints) and decoded
with replacement. Neither: no logs. Those two keys are its profile table's own
(`TABLE`; on another kind's service they are refused: that service has its own log), and its `algorithm` may
be left out or "auto" (read from /server_info before collection, run/discovery.py).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_dflash.config.placeholders import render
from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.config.tables.kinds import KindTable
from pytest_dflash.config.tables.reader import Table
from pytest_dflash.errors import DflashError
from pytest_dflash.hostaccess.transport import JOURNAL_SLACK_S, Transport
from pytest_dflash.scrub.bounds import LOG_READ_BYTES
from pytest_dflash.services.base import Kind, LogMark, ServiceHost, ServiceState

LOG_COMMAND_TIMEOUT_S = 30.0
# Its profile table's own keys, and their JSON Schema.
LOG_KEYS = {
    "log_command": {"type": "string", "description": "external: a command printing its log ({since})"},
    "log_file": {"type": "string", "pattern": "^/", "description": "external: a log file on the host"},
}


@dataclass
class ExternalService:
    """A server this tool only attaches to by URL; its log, if any, from the profile's log_command or
    log_file."""

    spec: ServiceSpec
    transport: Transport | None = None  # where log_command runs / log_file is read (None: no logs)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def provisioned(self) -> bool:
        return False

    @property
    def provisionable(self) -> bool:
        return False  # only ever attached to

    @property
    def native_api(self) -> bool | None:
        return None  # asking before it answers would call a server that is not up yet "not SGLang"

    @property
    def started_env(self) -> Mapping[str, str] | None:
        return None  # started elsewhere, by someone else

    @property
    def url(self) -> str:
        return self.spec.url

    def attach(self) -> None:
        """Nothing to read first: its state is unknown (read over HTTP by readiness)."""
        return None

    def start(self) -> None:
        """Nothing to start: an external service is only attached to."""

    def stop(self) -> None:
        """Nothing to stop."""

    def state(self) -> ServiceState:
        return ServiceState(running=None)

    def log_mark(self) -> LogMark:
        if self.transport is None or not (self.spec.log_command or self.spec.log_file):
            return LogMark(time.time())
        try:
            wall = time.time() + self.transport.clock_offset()
            if self.spec.log_file:
                size = self.transport.run("stat -c %%s %s 2>/dev/null || echo 0", self.spec.log_file,
                                          timeout_s=10)
                return LogMark(wall, int(size.stdout.strip() or 0) if size.stdout.strip().isdigit() else 0)
        except DflashError:
            return LogMark(time.time())
        return LogMark(wall)

    def logs_since(self, mark: LogMark | None, lines: int) -> str:
        if self.transport is None:
            return ""
        lines = int(lines)
        if self.spec.log_file:
            path = shlex.quote(self.spec.log_file)
            offset = mark.offset if mark else 0
            # From the test's offset, unless the file is shorter now (rotated or truncated): then its end; at
            # most its last LOG_READ_BYTES either way (tail -c +N seeks: nothing before is read).
            command = (f"size=$(stat -c %s {path}) || exit 1; from={offset}; [ $size -ge $from ] || from=0; "
                       f"[ $((size - from)) -le {LOG_READ_BYTES} ] || from=$((size - {LOG_READ_BYTES})); "
                       f"tail -c +$((from + 1)) {path}")
            return _last_lines(self._read(command, f"log_file {self.spec.log_file}"), lines)
        if self.spec.log_command:
            wall = (mark.wall_time - self.transport.clock_error_s - JOURNAL_SLACK_S) if mark else 0.0
            values = {"since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(0.0, wall))),
                      "since_unix": f"{max(0.0, wall):.3f}", "lines": str(lines)}
            try:
                command = render(self.spec.log_command, values, where=f"services.{self.name}.log_command")
            except ValueError as exc:
                return f"(no logs: {exc})"
            return _last_lines(self._read(f"{command} 2>&1", "log_command"), lines)
        return ""

    def _read(self, command: str, what: str) -> str:
        """The end of what `command` prints (stdout and stderr), bounded where it runs (Transport.read_tail:
        at most LOG_READ_BYTES, whatever the command prints) and decoded with replacement."""
        assert self.transport is not None
        try:
            result = self.transport.read_tail(command, timeout_s=LOG_COMMAND_TIMEOUT_S)
        except DflashError as exc:
            return f"(could not read the log ({what}): {exc})"
        if not result.ok:
            said = " ".join(result.tail(3).split())
            return f"(could not read the log ({what}): exit {result.rc}{': ' + said if said else ''})"
        return result.stdout

    def describe(self) -> dict[str, str]:
        logs = "none (give log_command or log_file; --attach-log-command with --attach)"
        if self.transport is not None and self.spec.log_command:
            logs = f"log_command: {self.spec.log_command}"
        elif self.transport is not None and self.spec.log_file:
            logs = f"log_file: {self.spec.log_file}"
        return {"kind": "external", "url": self.url, "logs": logs,
                "liveness": "over HTTP (GET /v1/models; refused after it had answered = gone)"}


def _last_lines(text: str, lines: int) -> str:
    """The last `lines` lines of `text`, ending with a newline when there are any."""
    if lines <= 0 or not text.strip():
        return ""
    return "\n".join(text.splitlines()[-lines:]) + "\n"


def _make(spec: ServiceSpec, host: ServiceHost) -> ExternalService:
    if not (spec.log_command or spec.log_file):
        return ExternalService(spec)
    if host.has_host_access:
        return ExternalService(spec, host.transport)
    # --attach-log-command: no host access, the log command runs on this machine (read-only).
    local = dataclasses.replace(host.profile, connection="local://")
    return ExternalService(spec, Transport(local, read_only=True))


def _read_table(table: Table, spec: ServiceSpec, host: HostProfile, profile_dir: Path) -> ServiceSpec:
    """Where its log is read: `log_command` or `log_file` (an absolute path), through the host's
    connection."""
    log_command = table.get("log_command", str)
    log_file = table.get("log_file", str)
    if log_command and log_file:
        raise table.fail("log_file", "give log_command or log_file, not both")
    if log_file and not log_file.startswith("/"):
        raise table.fail("log_file", f"expected an absolute path on the host, got {log_file!r}")
    if (log_command or log_file) and host.connection is None:
        raise table.fail("log_command" if log_command else "log_file", "needs host access (a connection)")
    return dataclasses.replace(spec, log_command=log_command, log_file=log_file)


TABLE = KindTable("external", read=_read_table, keys=LOG_KEYS, elsewhere="a {kind} service has its own log",
                  auto_algorithm=True)
KIND = Kind("external", make=_make, table=TABLE)
