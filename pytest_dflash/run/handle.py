"""One service of a host as the tests see it: `ServiceHandle` (its manager, its client, its readiness and
the facts the verdict records about it) and the one-line summary of why a service is not usable.

A handle is made and started by its host (run/state.py's `HostContext`), so it knows its host and run through
the Protocols `HandleHost` and `HandleRun` here, not their classes: naming them would be an import cycle
(tools/check_imports.py counts type-only imports too). The service kinds live in services/registry.py, the
judgements after readiness in services/liveness.py and services/stuck.py, the progress lines in
services/events.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from pytest_dflash import interrupts
from pytest_dflash.client.deadline import DeadlineExceeded
from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.errors import (
    ApiError,
    Death,
    DflashError,
    ServiceCrashed,
    ServiceError,
    ServiceNotReady,
    ServiceRestarted,
    TransportError,
)
from pytest_dflash.run.blocking import Failure, LayerBook
from pytest_dflash.run.records import HostFacts, RunOptions
from pytest_dflash.scrub.bounds import LINE_BYTES, scrub
from pytest_dflash.services.base import LogMark, ServiceHost, ServiceManager
from pytest_dflash.services.events import Progress, ServiceEvent
from pytest_dflash.services.health import health_bypass
from pytest_dflash.services.liveness import death_after_readiness
from pytest_dflash.services.ranks import rank_watch, wedge_at_tp
from pytest_dflash.services.readiness import ReadinessWatcher
from pytest_dflash.services.served import ServedConfig, command_of, served_config
from pytest_dflash.services.speculation import served_speculation, shown_launch_command
from pytest_dflash.services.startup import ReadyReport
from pytest_dflash.services.stuck import judge_lost_request

# how often a service waiting for its GPU neighbour's memory looks (and at the run's end)
SETTLE_POLL_S = 0.25



class HandleRun(Protocol):
    """What a service's handle reads of its run (run/state.py's `DflashRun` is one)."""

    @property
    def options(self) -> RunOptions: ...

    @property
    def progress(self) -> Progress:
        """Thread-safe: a peer's background readiness wait says its lines through it."""
        ...

    @property
    def book(self) -> LayerBook: ...

    @property
    def cleaning(self) -> bool:
        """The run's cleanup has begun: nothing may be started any more."""
        ...


class HandleHost(ServiceHost, Protocol):
    """What a service's handle, and a check holding one, reads of its host (run/state.py's `HostContext` is
    one): what its managers see, plus its run, its facts and notes, and the starts it schedules."""

    @property
    def run(self) -> HandleRun: ...

    @property
    def facts(self) -> HostFacts: ...

    @property
    def notes(self) -> list[str]: ...

    @property
    def provisioning(self) -> bool: ...

    @property
    def services(self) -> dict[str, ServiceHandle]: ...

    def service(self, name: str) -> ServiceHandle: ...

    def add_service(self, spec: ServiceSpec) -> ServiceHandle:
        """A service the run derives itself (e.g. a plain server for tie triage)."""
        ...

    def prestart(self, first: ServiceHandle) -> None:
        """Provisioning: take the host lock, clean up stale leftovers, start `first` (and its peers)."""
        ...

    def start_service(self, handle: ServiceHandle, why: str = "") -> None:
        """Start one service (unless the run is ending) and say so."""
        ...


@dataclass
class ServiceHandle:
    """One service of a host as the tests see it: manager + client + readiness outcome."""

    spec: ServiceSpec
    host: HandleHost
    manager: ServiceManager
    ready: ReadyReport | None = None
    # a readiness wait that failed: how far the start-up got (its timeline row in the report)
    stopped: ReadyReport | None = None
    failure: DflashError | None = None
    started_mark: LogMark | None = None
    server_info: dict[str, Any] | None = None
    # why /server_info could not be read after readiness (not "not served": that is a server that is not
    # SGLang); a check that needs it then skips as "could not check" (run/skips.py), never as "not SGLang"
    server_info_error: str | None = None
    base_restarts: int = 0
    # the test that failed with `failure`: later tests are skipped as blocked naming it (none yet: the next
    # test that needs the service fails with it, e.g. a peer whose start failed while another one started)
    failure_reported_by: str | None = None
    _client: InferenceClient | None = None
    # A peer started beside the service a test asked for waits for readiness in the background
    # (wait_in_background)
    _background: threading.Thread | None = None
    _background_error: BaseException | None = None
    # the test now using the service (run/fixtures.use_service): a request that runs out of time fails it
    current_test: str | None = None
    _stuck_lock: threading.Lock = field(default_factory=threading.Lock)
    # Set once this started service's GPU memory is settled (its KV pools allocated, its port open, or its
    # readiness wait over): a service sharing its GPU may start from then on (HostContext.prestart).
    settled: threading.Event = field(default_factory=threading.Event)
    settled_by: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def label(self) -> str:
        return f"{self.host.name}/{self.spec.name}"

    @property
    def url(self) -> str:
        return self.manager.url

    @property
    def client(self) -> InferenceClient:
        if self._client is None:
            api_key = os.environ.get(self.spec.api_key_env) if self.spec.api_key_env else None
            timeout = httpx.Timeout(self.host.run.options.request_timeout_s, connect=5.0)
            self._client = InferenceClient(self.url, service=self.label, api_key=api_key,
                                           model=self.spec.model, timeout=timeout,
                                           limit_name="--request-timeout")
            self._client.on_deadline = self._out_of_time
        return self._client

    @property
    def api_key_in_use(self) -> str | None:
        """The API key this service's client sends, None when it sends none or no client was made yet (reading
        this never makes one: evidence redacts the keys in use without opening connections)."""
        return self._client.api_key if self._client is not None else None

    def _out_of_time(self, error: DeadlineExceeded) -> str:
        """A request of this ready service ran out of its total time: the first one that had at least
        --request-timeout fails the service, once, like a death (the test it ran in fails with it; every later
        test that needs the service is blocked naming it). Its engine is asked whether it still makes progress
        (stuck, or far too slow); the answer is added to the request's error. Readiness has its own rules, and
        a call given less than --request-timeout (a liveness probe) says nothing about the service."""
        request_timeout = self.host.run.options.request_timeout_s
        if self.ready is None or error.limit_s < request_timeout:
            return ""
        if not self._stuck_lock.acquire(blocking=False):
            return "the service is being judged stuck or too slow by another of its requests"
        try:
            if self.failure is not None:
                return ""
            stuck, said = judge_lost_request(self.client, error, label=self.label, native=self.native,
                                             request_timeout_s=request_timeout,
                                             health_bypassed=self.health_bypassed, version=self.version)
            if stuck is None:
                return said
            if stuck.moving is False:
                transport = self.host.transport if self.host.has_host_access else None
                tp, ranks = wedge_at_tp(self.manager, transport, server_info=self.server_info,
                                        gpus=self.spec.gpus, since=self.started_mark,
                                        log_lines=self.host.run.options.journal_lines)
                stuck.progress += f"; {tp}" if tp else ""
                stuck.ranks = tuple(ranks)
            self.failure = stuck
            test = self.current_test or "?"
            self.failure_reported_by = test
            summary = scrub(str(stuck), LINE_BYTES, "summary")
            self.host.run.book.record_death(Failure(self.host.name, "service", self.name, test, summary))
            self.client.unusable = str(stuck)
            self.host.run.progress(self.event("failed", readiness_error_summary(stuck)))
            return f"the service is {stuck.what}: {said}; every later test of this service is blocked"
        finally:
            self._stuck_lock.release()

    @property
    def health_bypassed(self) -> str | None:
        """Why this service's /health_generate proves nothing (SGLANG_DIAG_BYPASS_HEALTH_GENERATE set in the
        environment it was started with, as far as the plugin sees it: the profile's env, and the whole
        environment this run started it with where its manager says it, `ServiceManager.started_env`); None
        where it proves output."""
        bypass = health_bypass(self.spec.env, where=f"the profile's env of {self.label}")
        started = self.manager.started_env
        if bypass is None and started is not None:
            bypass = health_bypass(started,
                                   where="the environment this run started it with (its own, inherited)")
        return bypass

    @property
    def native(self) -> bool:
        """True when the server speaks SGLang's native API (/generate, /server_info)."""
        return self.server_info is not None

    @property
    def algorithm(self) -> str:
        if self.server_info and self.server_info.get("speculative_algorithm"):
            return str(self.server_info["speculative_algorithm"]).upper()
        return self.spec.algorithm

    @property
    def algorithm_unknown(self) -> str | None:
        """Why its speculative algorithm is unknown (selected as plain: it answered no /server_info at
        discovery, nor since); None when the profile, --attach-algorithm or /server_info says it."""
        return self.spec.algorithm_unknown if self.server_info is None else None

    @property
    def served(self) -> ServedConfig:
        """Its parsers, grammar backend and parallel sizes: /server_info's, else its command's (services/
        served.py); the generation checks read the parsers here, rank naming the tp size."""
        return served_config(command_of(self.spec), self.server_info)

    @property
    def version(self) -> str | None:
        return (str(self.server_info["version"]) if self.server_info and "version" in self.server_info
                else None)

    def facts(self) -> dict[str, Any]:
        """What the verdict records about this service."""
        info = self.server_info or {}
        return {
            "url": self.url,
            "algorithm": "unknown" if self.algorithm_unknown else self.algorithm,
            "algorithm_unknown": self.algorithm_unknown,
            "version": self.version,
            "model": info.get("model_path"),
            "num_draft_tokens": info.get("speculative_num_draft_tokens"),
            "speculation": served_speculation(info) or None,  # what /server_info says is speculated, and how
            # SGLang 0.5.20+: how it was started (secrets masked, capped); 0.5.21+: which frontend serves it
            "launch_command": shown_launch_command(info),
            "served": self.served.fact(),  # parsers, grammar backend, parallel sizes (/server_info)
            "frontend": info.get("frontend"),
            "provisioned": self.manager.provisioned,
            "configured": self.spec.configured(),  # the profile's command: compared when it never came up
            "ready": self.ready.as_dict() if self.ready else None,
            "stopped": self.stopped.as_dict() if self.stopped else None,
            "server_info_error": self.server_info_error,
        }

    def ensure_ready(self) -> ReadyReport:
        """Start (when provisioning) and wait until a real greedy and sampled generation succeeded."""
        if self._background is not None:
            self._join_background()
        if self.failure is not None:
            raise self.failure
        if self.ready is not None:
            return self.ready
        try:
            self.host.prestart(self)
        except DflashError as exc:
            self.failure = exc
            self.host.run.progress(self.event("failed", f"not started: {readiness_error_summary(exc)}"))
            raise
        return self._become_ready()

    def wait_in_background(self) -> None:
        """Wait for this just-started peer's readiness now, beside the wait a test is in: on the H200 each new
        SGLang process took 80-256 s for its first sampled request, so waits one after another add up. The
        outcome is the same as a foreground wait's (ready, or the failure its first test then reports)."""
        if self.ready is not None or self.failure is not None or self._background is not None:
            return
        self._background = threading.Thread(target=self._become_ready_in_background,
                                            name=f"ready {self.label}", daemon=True)
        self._background.start()

    def _become_ready_in_background(self) -> None:
        try:
            self._become_ready()  # its lines: the run's progress takes them from any thread
        except DflashError:
            pass  # kept in self.failure
        except BaseException as exc:  # a bug: re-raised in the test that joins
            self._background_error = exc

    def _join_background(self) -> None:
        assert self._background is not None
        while self._background.is_alive():
            self._background.join(0.25)  # short joins: Ctrl-C still reaches the main thread
            interrupts.raise_if_lost()
        self._background = None
        if self._background_error is not None:
            raise self._background_error

    def event(self, state: str, what: str) -> ServiceEvent:
        return ServiceEvent(f"{self.label}: {what}", host=self.host.name, service=self.name, state=state)

    def settle(self, why: str) -> None:
        """This service's GPU memory is settled (`why`): the services waiting to share its GPU may start."""
        if not self.settled.is_set():
            self.settled_by = why
            self.settled.set()

    def start_after(self, predecessors: list[ServiceHandle]) -> None:
        """In the background: start this service once each of `predecessors` (starting on a GPU it shares) is
        settled, then wait for its readiness as wait_in_background does."""
        self._background = threading.Thread(target=self._start_when_settled, args=(predecessors,),
                                            name=f"start {self.label}", daemon=True)
        self._background.start()

    def _start_when_settled(self, predecessors: list[ServiceHandle]) -> None:
        try:
            for other in predecessors:
                while not other.settled.wait(SETTLE_POLL_S):
                    if self.host.run.cleaning:
                        raise ServiceError(f"{self.label}: not started: the run is ending")
            after = "; ".join(f"{other.name}: {other.settled_by}" for other in predecessors)
            self.host.start_service(self, f" once the GPU memory of the service(s) it shares a GPU with was "
                                          f"settled ({after})")
        except DflashError as exc:
            self.failure = exc
            self.settle("it was never started")
            if not self.host.run.cleaning:  # the run's end is no failure of the service
                self.host.run.progress(self.event("failed", f"not started: {readiness_error_summary(exc)}"))
            return
        except BaseException as exc:  # a bug: re-raised in the test that joins
            self._background_error = exc
            self.settle("it was never started")
            return
        self._become_ready_in_background()

    def _become_ready(self) -> ReadyReport:
        progress = self.host.run.progress
        # the restarts before the wait: one during the wait fails readiness; one between the wait and a later
        # read (a /server_info retried while the unit came back) would otherwise be taken for the baseline
        try:
            self.base_restarts = self.manager.state().restarts
        except TransportError:
            self.base_restarts = 0
        try:
            self.ready = self._wait(progress)
        except DflashError as exc:
            self.failure = exc
            progress(self.event("failed", f"not ready: {readiness_error_summary(exc)}"))
            raise
        finally:  # ready, dead or given up on: nothing more of it will be allocated while it starts
            self.settle("its readiness wait ended")
        progress(self.event("ready", f"ready after {self.ready.total_s:.1f}s"))
        try:
            self.server_info = self.client.server_info()  # transient answers retried (client/inference.py)
        except ApiError as exc:
            self.server_info = None
            said = f"HTTP {exc.status}" if exc.status is not None else "no HTTP response"
            self.server_info_error = f"GET {exc.endpoint}: {said}: {exc.message}"[:300]
        return self.ready

    def _wait(self, progress: Callable[[str], None]) -> ReadyReport:
        what = None if self.manager.provisioned else self.manager.attach()
        if what is not None:
            try:
                state = self.manager.state()
            except ServiceError as exc:
                raise ServiceCrashed(self.label, Death(detail=str(exc)), "", "attach") from None
            if state.death is not None:
                raise ServiceCrashed(self.label, state.death,
                                     self.manager.logs_since(None, self.host.run.options.journal_lines),
                                     f"attach (the {what} is not running; attach mode never starts it)")
        # None: an external server, asked (/server_info) once it answers HTTP
        native = self.manager.native_api
        budget = self.host.run.options.ready_timeout_s or self.spec.ready_timeout_s
        watcher = ReadinessWatcher(
            self.manager, self.client, native=native, budget_s=budget,
            sampled_budget_s=min(budget, self.spec.sampled_timeout_s),
            log_lines=self.host.run.options.journal_lines, progress=progress,
            log_mark=self.started_mark, request_timeout_s=self.host.run.options.request_timeout_s,
            abandoned=lambda: self.host.run.cleaning, on_settled=self.settle,
            health_bypassed=self.health_bypassed, nccl_init_budget_s=self.spec.nccl_init_timeout_s,
            gpus=self.spec.gpus, label=self.label,
            rank_watch=rank_watch(self.manager, self.host.transport if self.host.has_host_access else None,
                                  self.spec.gpus),
        )
        try:
            return watcher.wait()
        finally:
            self.stopped = watcher.stopped

    def check_alive(self) -> ServiceCrashed | ServiceRestarted | None:
        """After a test: did the service die or restart? (one cheap state read)"""
        if self.ready is None:
            return None
        return death_after_readiness(self.manager, self.client, label=self.label, since=self.started_mark,
                                     base_restarts=self.base_restarts,
                                     log_lines=self.host.run.options.journal_lines, gpus=self.spec.gpus)


def readiness_error_summary(exc: BaseException) -> str:
    """A one-line statement of why a service is not usable."""
    if isinstance(exc, ServiceCrashed | ServiceRestarted | ServiceNotReady | ServiceError | TransportError):
        return str(exc).splitlines()[0]
    return f"{type(exc).__name__}: {exc}".splitlines()[0]
