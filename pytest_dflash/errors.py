"""Errors raised by pytest-dflash.

    DflashError
     ├── InventoryError        a host profile is malformed (names file, key, expectation)
 ├── DocumentTooDeep       a JSON or TOML document nested deeper than it can be read (also a ValueError)
     ├── TransportError        a command could not run on a host, or hit its deadline
     │    └── HostUnreachable  ssh could not connect at all
     ├── ReadOnlyViolation     a state-changing command was attempted in attach mode
     ├── ServiceError          a service could not be started, stopped or reached
     │    ├── ServiceCrashed    the process / unit died (exit status, log tail, the ranks that failed)
     │    │    └── ServiceGone  attached by URL: it answered, then refused connections (seen over HTTP)
     │    ├── ServiceRestarted  systemd restarted it behind our back (NRestarts grew)
     │    ├── ServiceNotReady   readiness budget spent without a real generation (a stopped rank named)
     │    └── ServiceBusy       another run holds the host-side lock
     └── ApiError              an HTTP call failed: status, body excerpt, a dropped connection, or a
                               body over its size cap
"""

from __future__ import annotations

from dataclasses import dataclass, field


class DflashError(Exception):
    """Base class of every error this plugin raises on purpose."""


class InventoryError(DflashError):
    """A host profile (or fleet inventory) is invalid."""

    def __init__(self, source: str, key: str, expected: str) -> None:
        self.source, self.key, self.expected = source, key, expected
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {expected}")


class DocumentTooDeep(DflashError, ValueError):
    """A JSON or TOML document (a file, a server's answer) nests arrays or tables deeper than Python's parser
    can follow: a ValueError like any other unreadable document, never a RecursionError."""


class TransportError(DflashError):
    """A command could not be run on a host, or ran past its deadline."""


class HostUnreachable(TransportError):
    """The host did not accept a connection (ssh error text attached)."""


class ReadOnlyViolation(DflashError):
    """Attach mode promises to change nothing on a host; something tried to."""


class ServiceError(DflashError):
    """A service could not be started, stopped or reached."""


@dataclass
class Death:
    """How a service process ended, as far as the service manager can tell."""

    exit_status: int | None = None  # 0-255, as a shell reports it (137 = SIGKILL)
    signal: str | None = None  # "KILL", "TERM", … when killed by a signal
    result: str | None = None  # systemd Result= ("exit-code", "signal", "oom-kill", …)
    restarts: int = 0
    detail: str = ""

    def describe(self) -> str:
        parts = []
        if self.signal:
            parts.append(f"killed by SIG{self.signal}")
        elif self.exit_status is not None:
            parts.append(f"exited with status {self.exit_status}")
        if self.result and self.result not in ("success",):
            parts.append(f"Result={self.result}")
        if self.restarts:
            parts.append(f"NRestarts={self.restarts}")
        if self.detail:
            parts.append(self.detail)
        return ", ".join(parts) or "ended"


@dataclass(frozen=True)
class RankFault:
    """One tensor-parallel rank that died or stopped: which rank, its process, its GPU, what happened and
    when. Carried by the errors that name it, so the diagnosis, the verdict JSON and JUnit name one rank."""

    rank: int
    event: str  # "died", "failed", "stopped"
    how: str = ""  # "killed by SIGKILL", "exit code -11", "RuntimeError: …", "SIGSTOP or a debugger"
    pid: int | None = None
    gpu: str = ""  # "GPU 5" (the profile's gpus) or "visible GPU 1"
    bus_id: str = ""  # where the host layer's inventory knows it
    when: str = ""  # "start-up", "readiness", "serving"

    @property
    def label(self) -> str:
        return f"TP{self.rank}"

    def where(self) -> str:
        """'rank 1, pid 25192, visible GPU 1, bus 00000000:19:00.0'."""
        parts = [f"rank {self.rank}"]
        if self.pid is not None:
            parts.append(f"pid {self.pid}")
        if self.gpu:
            parts.append(self.gpu)
        if self.bus_id:
            parts.append(f"bus {self.bus_id}")
        return ", ".join(parts)

    def sentence(self) -> str:
        """'tensor-parallel rank TP1 (rank 1, pid 25192, visible GPU 1) died while serving: killed by
        SIGKILL'."""
        when = {"start-up": " at start-up", "readiness": " during readiness",
                "serving": " while serving"}.get(self.when, "")
        return (f"tensor-parallel rank {self.label} ({self.where()}) {self.event}{when}"
                + (f": {self.how}" if self.how else ""))

    def as_dict(self) -> dict[str, object]:
        """The verdict JSON's entry (`services.<svc>.ranks`)."""
        out: dict[str, object] = {"rank": self.rank, "label": self.label, "event": self.event,
                                  "said": self.sentence()}
        out.update({key: value for key, value in (("how", self.how), ("pid", self.pid), ("gpu", self.gpu),
                                                  ("bus_id", self.bus_id), ("when", self.when))
                    if value not in (None, "")})
        return out


@dataclass(eq=False)
class ServiceCrashed(ServiceError):
    """The service died; carries how it ended and the end of its log."""

    service: str
    death: Death
    log_tail: str = ""
    phase: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    # a tensor-parallel service: each rank its log names as failed, with its pid and GPU (services/ranks.py)
    ranks: tuple[RankFault, ...] = ()

    def __str__(self) -> str:
        where = f" during {self.phase}" if self.phase else ""
        named = "".join(f"; {rank.sentence()}" for rank in self.ranks)
        return f"service {self.service} died{where}: {self.death.describe()}{named}"


@dataclass(eq=False)
class ServiceGone(ServiceCrashed):
    """Attached by URL, no process to ask: the server had answered HTTP, then dropped a request and/or
    refused connections. As conclusive as an exit status: a compiling JIT still answers HTTP."""

    request: str = ""  # the request in flight when it went: method, path, sampling parameters
    # what HTTP showed, in order: "no HTTP response (connection dropped), then connections refused"
    seen: str = ""
    answered_s_before: float | None = None  # how long before the refusal it last answered HTTP

    def __str__(self) -> str:
        where = f" during {self.phase}" if self.phase else ""
        killer = f"{self.request} killed it: " if self.request else ""
        last = ("" if self.answered_s_before is None
                else f"; it had answered HTTP {self.answered_s_before:.1f}s before")
        return (f"service {self.service} is gone{where}: {killer}{self.seen}{last} "
                "(seen over HTTP: attached by URL, no process to ask)")


@dataclass(eq=False)
class ServiceRestarted(ServiceError):
    """systemd restarted the unit: it crashed even if it is 'active' right now."""

    service: str
    before: int
    after: int
    log_tail: str = ""

    def __str__(self) -> str:
        return (
            f"service {self.service} restarted {self.after - self.before} time(s) "
            f"(NRestarts {self.before} -> {self.after}) although systemd may call it active"
        )


@dataclass(eq=False)
class ServiceNotReady(ServiceError):
    """The readiness budget ran out without a successful greedy and sampled generation."""

    service: str
    waited_s: float
    last_problem: str
    log_tail: str = ""
    # a tensor-parallel service whose wait a rank ended (stopped, stuck in NCCL init): that rank (ranks.py)
    ranks: tuple[RankFault, ...] = ()

    def __str__(self) -> str:
        return f"service {self.service} not ready after {self.waited_s:.0f}s: {self.last_problem}"


class ServiceBusy(ServiceError):
    """Another run holds the host-side lock for this host."""


@dataclass(eq=False)
class ApiError(DflashError):
    """An HTTP call to a service failed; `status` is None when no HTTP answer came at all."""

    service: str
    endpoint: str
    status: int | None
    message: str
    body: str = ""
    # Why no usable answer came: "refused" (nothing listening), "dropped" (connection closed without an
    # answer), "timeout" (accepted, not answered in time), "too-large" (body over its cap); "" otherwise.
    cause: str = ""

    def __str__(self) -> str:
        status = f"HTTP {self.status}" if self.status is not None else "no HTTP response"
        body = f": {self.body[:300]}" if self.body else ""
        return f"{self.service} {self.endpoint}: {status}: {self.message}{body}"

    @property
    def dropped(self) -> bool:
        """True when the server closed the connection without answering (it likely died)."""
        return self.status is None


class GpuFault(AssertionError):
    """A host-layer check failed on particular GPUs: it blocks only the services whose `gpus` include one of
    them (run/blocking.py); services on healthy GPUs go on. `labels` name each GPU (index, bus id, UUID)."""

    def __init__(self, message: str, gpus: tuple[int, ...], labels: tuple[str, ...]) -> None:
        super().__init__(message)
        self.gpus = gpus
        self.labels = labels
