"""What every service manager offers: start, stop, one-round-trip state, and logs since a mark."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Protocol

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.errors import Death


@dataclass(frozen=True)
class LogMark:
    """A position in a service's log: a wall-clock time (journal) and/or a byte offset (file)."""

    wall_time: float
    offset: int = 0


@dataclass(frozen=True)
class ServiceState:
    """The process / unit state, read in one round trip."""

    running: bool | None  # None: unknown (no host access)
    death: Death | None = None
    restarts: int = 0
    pid: int | None = None
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def dead(self) -> bool:
        return self.death is not None

    def summary(self) -> str:
        if self.death:
            return self.death.describe()
        if self.running is None:
            return "unknown (no host access)"
        active = self.properties.get("ActiveState")
        sub = self.properties.get("SubState")
        state = f"{active}/{sub}" if active else ("running" if self.running else "not running")
        return f"{state}, pid {self.pid}" if self.pid else state


class ServiceManager(Protocol):
    """One service's process or unit on its host."""

    spec: ServiceSpec

    @property
    def name(self) -> str: ...

    @property
    def provisioned(self) -> bool:
        """True when this run started the service (and so must stop it)."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def state(self) -> ServiceState: ...

    def log_mark(self) -> LogMark: ...

    def logs_since(self, mark: LogMark | None, lines: int) -> str: ...

    def describe(self) -> dict[str, str]:
        """Unit / process properties worth attaching as evidence."""
        ...


def death_from_returncode(returncode: int) -> Death:
    """Popen semantics (negative = killed by that signal) to shell semantics (128 + signal)."""
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name.removeprefix("SIG")
        except ValueError:
            name = str(number)
        return Death(exit_status=128 + number, signal=name)
    return Death(exit_status=returncode)
