"""Per-run state: the hosts under test, the order their services start in, and everything that must be undone.

`DflashRun` owns one `HostContext` per host; a `HostContext` owns the transport, the host lock and one
`ServiceHandle` (run/handle.py) per service. Whatever a run provisions is recorded here the moment it is
started, so `DflashRun.cleanup()` (called at session end, on Ctrl-C, on SIGTERM and at exit) can stop it even
when readiness failed half way. The run's options and a host's facts are plain records (run/records.py).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_dflash import interrupts
from pytest_dflash.config.paths import state_root
from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.errors import DflashError, ServiceError
from pytest_dflash.hostaccess.hostlock import HostLock
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.run.blocking import LayerBook
from pytest_dflash.run.handle import SETTLE_POLL_S, ServiceHandle, readiness_error_summary
from pytest_dflash.run.records import HostFacts, RunOptions
from pytest_dflash.services.events import Progress
from pytest_dflash.services.registry import make_manager, reap_leftovers


def _silent(message: str) -> None:
    pass


@dataclass
class HostContext:
    """One host under test."""

    profile: HostProfile
    run: DflashRun
    services: dict[str, ServiceHandle] = field(default_factory=dict)
    needed: set[str] = field(default_factory=set)  # services a selected test uses (collection.record_needed)
    # a selected test uses the GPU layers' dflash_gpu: the pre-flight probes its GPUs
    gpu_tested: bool = False
    facts: HostFacts = field(default_factory=HostFacts)
    notes: list[str] = field(default_factory=list)
    # (section, key) -> a copy of the entry this process last put on a report (evidence.attach sends changes
    # only)
    reported: dict[tuple[str, str], Any] = field(default_factory=dict)
    # the fleet pre-flight's bring-up of this host while tests run (run/preflight.py); its tests wait for it
    bring_up: concurrent.futures.Future[None] | None = None
    _transport: Transport | None = None
    _lock: HostLock | None = None
    _lock_failure: DflashError | None = None
    # held while a service is started and while teardown stops them: a start in a background thread either
    # completes before teardown (which then stops it) or sees the run's cleanup and starts nothing
    _start_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def provisioning(self) -> bool:
        return self.profile.provision == "always" or (self.run.options.provision
                                                      and self.profile.provision != "never")

    @property
    def has_host_access(self) -> bool:
        return self.profile.connection is not None

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            self._transport = Transport(self.profile, read_only=not self.provisioning)
        return self._transport

    def service(self, name: str) -> ServiceHandle:
        if name not in self.services:
            spec = self.profile.services[name]
            self.services[name] = ServiceHandle(spec, self, make_manager(spec, self))
        return self.services[name]

    def add_service(self, spec: ServiceSpec) -> ServiceHandle:
        """A service the run derives itself (e.g. a plain server for tie triage); provisioned like the
        others."""
        if spec.name in self.profile.services or spec.name in self.services:
            raise ServiceError(f"{self.name}: a service named {spec.name!r} already exists")
        handle = ServiceHandle(spec, self, make_manager(spec, self))
        self.services[spec.name] = handle
        self.needed.add(spec.name)
        return handle

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def log_dir(self) -> Path:
        return self.run.log_dir

    def prestart(self, first: ServiceHandle) -> None:
        """Provisioning: take the host lock, clean up stale leftovers, start `first` (and its peers)."""
        if not self.provisioning or first.manager.provisioned or not first.manager.provisionable:
            return
        if self._lock_failure is not None:
            raise self._lock_failure  # no lock, nothing started: not by the next service either
        if self.run.cleaning:  # a pre-flight thread after the run's cleanup: it would start what nobody stops
            raise ServiceError(f"{self.name}: not started: the run is ending")
        if self._lock is None:
            self._lock = HostLock(self.profile, self.run.run_id)
            self.run.register(self)
            try:
                self._lock.acquire(self.run.options.lock_wait_s, self.run.progress)
            except DflashError as exc:
                self._lock_failure = exc
                raise
            self.notes.extend(reap_leftovers(self, self.profile.services.values()))
        # Services on different GPUs start together. A service sharing a GPU with one still starting starts
        # once that one's GPU memory is settled (its KV pools allocated: ReadinessWatcher's StartupWatch), in
        # the background: two SGLang servers sizing their KV pools at once on one GPU charge each other's
        # memory (recorded S4e), but the long tail (CUDA-graph capture, the first sampled request's JIT) may
        # overlap.
        batch: list[ServiceHandle] = []
        for handle in [first, *(self.service(name) for name in sorted(self.needed - {first.name}))]:
            if handle.manager.provisioned or handle._background is not None or handle.failure is not None:
                continue
            if handle is not first and handle.spec.kind != first.spec.kind:
                continue
            batch.append(handle)
        now: list[ServiceHandle] = []
        later: list[tuple[ServiceHandle, list[ServiceHandle]]] = []
        for handle in batch:
            gpus = set(handle.spec.gpus)
            starting = [other for other in self.services.values()
                        if other is not handle and not other.settled.is_set() and gpus & set(other.spec.gpus)
                        and (other.manager.provisioned or other._background is not None)]
            planned = [other for other in (*now, *(h for h, _ in later)) if gpus & set(other.spec.gpus)]
            predecessors = [*starting, *(other for other in planned if all(other is not s for s in starting))]
            if handle is first and predecessors:
                self._wait_settled(first, predecessors)  # the test asked for it: it waits in the foreground
                predecessors = []
            if predecessors:
                later.append((handle, predecessors))
            else:
                now.append(handle)
        for handle in now:
            try:
                self.start_service(handle)
            except DflashError as exc:
                if handle is first:
                    raise
                handle.failure = exc
                handle.settle("it was never started")
                self.run.progress(handle.event("failed", f"not started: {readiness_error_summary(exc)}"))
        for handle in now[1:]:
            handle.wait_in_background()
        for handle, predecessors in later:
            shared = sorted({gpu for other in predecessors
                             for gpu in set(other.spec.gpus) & set(handle.spec.gpus)})
            names = ", ".join(other.name for other in predecessors)
            self.run.progress(f"{handle.label}: starts once the KV cache of {names} is allocated (shared GPU "
                              f"{', '.join(map(str, shared))}: two servers sizing their pools at once charge "
                              "each other's memory)")
            handle.start_after(predecessors)

    def start_service(self, handle: ServiceHandle, why: str = "") -> None:
        """Start one service (unless the run is ending) and say so."""
        with self._start_lock:
            if self.run.cleaning:
                raise ServiceError(f"{handle.label}: not started: the run is ending")
            handle.started_mark = handle.manager.log_mark()
            handle.manager.start()
        self.run.progress(handle.event("started", f"started ({handle.url}){why}"))

    def _wait_settled(self, handle: ServiceHandle, predecessors: list[ServiceHandle]) -> None:
        """Before starting `handle` in the foreground: each of `predecessors` (on a GPU it shares) is
        settled."""
        for other in predecessors:
            while not other.settled.wait(SETTLE_POLL_S):
                interrupts.raise_if_lost()
                if self.run.cleaning:
                    raise ServiceError(f"{handle.label}: not started: the run is ending")

    def teardown(self) -> list[str]:
        """Stop what this run started (unless --keep) and release the lock; returns problems."""
        problems: list[str] = []

        def stop(handle: ServiceHandle) -> None:
            try:
                handle.manager.stop()
            except (DflashError, OSError) as exc:
                problems.append(f"{handle.label}: {exc}")

        # In parallel: a real SGLang takes seconds to drain and exit after SIGTERM. Under the start lock: a
        # service a background thread is starting right now is stopped too (and none is started after this).
        with self._start_lock:
            pass
        stoppers = [threading.Thread(target=stop, args=(h,), name=f"stop-{h.label}")
                    for h in self.services.values() if h.manager.provisioned and not self.run.options.keep]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(timeout=180)
            if thread.is_alive():
                problems.append(f"{thread.name}: still stopping after 180s")
        for handle in self.services.values():
            if handle._client is not None:
                handle._client.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._transport is not None:
            self._transport.close()
        return problems


@dataclass
class DflashRun:
    """Everything one pytest process knows about the hosts under test."""

    profiles: dict[str, HostProfile]
    options: RunOptions
    run_id: str
    progress: Progress = _silent  # thread-safe: a peer's background readiness wait says its lines through it
    book: LayerBook = field(default_factory=LayerBook)
    hosts: dict[str, HostContext] = field(default_factory=dict)
    _registered: list[HostContext] = field(default_factory=list)
    _cleanup_lock: threading.Lock = field(default_factory=threading.Lock)
    _cleaned: bool = False
    _on_cleanup: list[Callable[[], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # what a failure of one GPU blocks: the services whose profile gives them that GPU
        self.book.service_gpus.update({(host, name): spec.gpus for host, profile in self.profiles.items()
                                       for name, spec in profile.services.items()})

    @property
    def cleaning(self) -> bool:
        """The run's cleanup has begun: nothing may be started any more."""
        return self._cleaned

    def on_cleanup(self, callback: Callable[[], None]) -> None:
        """Call `callback` first thing in cleanup (e.g. drop the pre-flight's bring-ups not begun)."""
        self._on_cleanup.append(callback)

    @property
    def log_dir(self) -> Path:
        return state_root() / "logs"

    def host(self, name: str) -> HostContext:
        if name not in self.hosts:
            self.hosts[name] = HostContext(self.profiles[name], self)
        return self.hosts[name]

    def register(self, host: HostContext) -> None:
        if host not in self._registered:
            self._registered.append(host)

    def cleanup(self) -> list[str]:
        """Stop everything this run provisioned. Idempotent; safe from a signal handler's exception path."""
        with self._cleanup_lock:
            if self._cleaned:
                return []
            self._cleaned = True
        problems: list[str] = []
        with interrupts.deferred():  # a Ctrl-C now would leave services running: latched, not raised
            for callback in self._on_cleanup:
                callback()
            for host in list(self.hosts.values()):
                try:
                    problems += host.teardown()
                except (DflashError, OSError) as exc:
                    problems.append(f"{host.name}: teardown failed: {exc}")
        return problems
