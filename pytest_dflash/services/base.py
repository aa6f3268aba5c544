"""What every service manager offers (start, stop, one-round-trip state, logs since a mark), what a host
offers a manager (`ServiceHost`), and what a service kind is (`Kind`: services/registry.py lists them).

The run (run/state.py, run/handle.py) knows managers through `ServiceManager` only: what differs between kinds
is a member of it (`attach`, `provisionable`, `native_api`, `started_env`) or of the kind (`Kind.reap`,
`Kind.table`), never an `isinstance` on a kind's class. The GPU layers ask for optional abilities
(`RunsProbes`, `LaunchesOnHost`), never for a kind.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.config.tables.kinds import KindTable
from pytest_dflash.errors import Death
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.services.derive import PlainTarget


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
    def url(self) -> str:
        """The service's base URL (its port filled in once known)."""
        ...

    @property
    def provisioned(self) -> bool:
        """True when this run started the service (and so must stop it)."""
        ...

    @property
    def provisionable(self) -> bool:
        """False for a service this tool only attaches to: --provision starts nothing and takes no host lock
        for it."""
        ...

    @property
    def native_api(self) -> bool | None:
        """True when the server speaks SGLang's native API by construction; None: ask it (/server_info) once
        it answers HTTP (asking earlier would call a server that is not up yet "not SGLang")."""
        ...

    @property
    def started_env(self) -> Mapping[str, str] | None:
        """The whole environment this run started the server with, where the manager sets it (a local
        process: this run's own environment, which it inherits, plus the profile's env); None where it does
        not (a unit, a container, an attached server: only the profile's env is known)."""
        ...

    def attach(self) -> str | None:
        """Attach mode (this run did not start it): expect it to run already and change nothing. Returns what
        must already be running ("unit", "container"), whose state is read before readiness (dead: it fails at
        once), or None when there is nothing to read first."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def state(self) -> ServiceState: ...

    def log_mark(self) -> LogMark: ...

    def logs_since(self, mark: LogMark | None, lines: int) -> str: ...

    def describe(self) -> dict[str, str]:
        """Unit / process properties worth attaching as evidence."""
        ...


@runtime_checkable
class RunsProbes(Protocol):
    """A manager whose service has an environment of its own that the env / kernels probes must run in (a
    container's image and env) rather than on the host: the GPU layers ask for this, never for a kind."""

    def run_probe(self, source: str, args: Sequence[str] = (), *,
                  timeout_s: float | None = None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LaunchEnvironment:
    """How a service's server is launched on its host, which the env / kernels probes reproduce: its command
    line (empty when unknown), environment and user."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    user: str | None
    source: str  # where argv / env were read from, for messages


@runtime_checkable
class LaunchesOnHost(Protocol):
    """A manager whose server runs in an environment the GPU layers can read (a command line, a unit): they
    ask for this, never for a kind. A manager without it (attached by URL) has no environment to probe."""

    def launch_environment(self, *, live: bool) -> LaunchEnvironment:
        """The service's launch environment. `live`: the run changes nothing on the host (attach mode), so
        what is installed there is read first (an installed unit), else what this run would launch."""
        ...


class ServiceHost(Protocol):
    """What a host under test offers the managers of its services (run/state.py's HostContext is one)."""

    @property
    def name(self) -> str: ...

    @property
    def profile(self) -> HostProfile: ...

    @property
    def has_host_access(self) -> bool: ...

    @property
    def transport(self) -> Transport:
        """The host's transport, opened on first use (read-only unless provisioning)."""
        ...

    @property
    def run_id(self) -> str: ...

    @property
    def log_dir(self) -> Path:
        """Where services run on this machine write their logs."""
        ...


@dataclass(frozen=True)
class Kind:
    """One kind of service (a profile's `kind = "..."`): how its manager is made for a spec on a host; how the
    leftovers of a dead run of that kind are cleared before provisioning (`reap`: the host and its profile's
    services of this kind, possibly none; returns what was done); and how a non-speculative twin of one of its
    services is derived for parity's tie triage (`derive_plain`; raises services.derive.PlainUnavailable;
    None: it cannot be); and what a profile may say about a service of the kind (`table`: its own keys and
    rules, registered with the kind; None: only the keys every kind shares). One file per kind defines its
    `KIND`."""

    name: str
    make: Callable[[ServiceSpec, ServiceHost], ServiceManager]
    reap: Callable[[ServiceHost, list[ServiceSpec]], list[str]] | None = None
    derive_plain: Callable[[ServiceSpec, PlainTarget], ServiceSpec] | None = None
    table: KindTable | None = None

    def __post_init__(self) -> None:
        if self.table is not None and self.table.name != self.name:
            raise ValueError(f"service kind {self.name!r} has the profile table of {self.table.name!r}")


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
