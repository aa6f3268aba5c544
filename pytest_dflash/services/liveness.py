"""The liveness probes: a request in flight in a thread while the state is polled (`InFlight`), the liveness
of a server reached only by URL, judged over HTTP (`HttpLiveness`), and whether a ready service died or
restarted since (`death_after_readiness`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.client.sampling import Sampling
from pytest_dflash.errors import (
    ApiError,
    Death,
    ServiceCrashed,
    ServiceGone,
    ServiceRestarted,
    TransportError,
)
from pytest_dflash.services.base import LogMark, ServiceManager
from pytest_dflash.services.ranks import rank_faults_in_log

# Over HTTP (no process state): SGLang's HTTP process serves /v1/models itself, so it answers while
# the scheduler is busy compiling; /health runs a generation through the scheduler (20 s, then 503).
LIVENESS_PATH = "/v1/models"
LIVENESS_EVERY_S = 1.0
LIVENESS_TIMEOUT_S = 2.0
HEALTH_PATH = "/health_generate"


class InFlight:
    """One request running in a background thread, so the state can be polled meanwhile."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.started = time.monotonic()
        self.result: object | None = None
        self.error: ApiError | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name="dflash-ready-request",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def generation(cls, client: InferenceClient, sampling: Sampling, native: bool,
                   timeout_s: float) -> InFlight:
        return cls(lambda: client.probe_generation(sampling, native=native, timeout_s=timeout_s))

    @classmethod
    def status(cls, client: InferenceClient, path: str, timeout_s: float) -> InFlight:
        """GET `path`; the result is its HTTP status."""
        return cls(lambda: client.request("GET", path, timeout_s=timeout_s).status_code)

    def _run(self, call: Callable[[], object]) -> None:
        try:
            self.result = call()
        except ApiError as exc:
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float) -> None:
        """Return when the request finished, or after `timeout_s` (the state must be polled meanwhile)."""
        self._thread.join(timeout_s)

    @property
    def age(self) -> float:
        return time.monotonic() - self.started



@dataclass
class HttpLiveness:
    """Is a server reached only by URL still there? Judged by a cheap GET its HTTP process answers itself.

    "answered" (any HTTP status), "refused" (nothing listens: conclusive once it had answered),
    "dropped" (closed without answering), "timeout" (accepted or not, no answer in time).
    """

    client: InferenceClient
    answered_at: float | None = None
    silent_since: float | None = None
    next_probe: float = 0.0

    def answered(self, now: float) -> None:
        self.answered_at, self.silent_since = now, None

    def probe(self, *, every_s: float = LIVENESS_EVERY_S) -> str:
        started = time.monotonic()
        self.next_probe = started + every_s
        try:
            self.client.request("GET", LIVENESS_PATH, timeout_s=LIVENESS_TIMEOUT_S)
        except ApiError as exc:
            if exc.cause != "refused":
                self.silent_since = self.silent_since or started
            return exc.cause or "error"
        self.answered(time.monotonic())
        return "answered"

    def silent_for(self) -> float:
        return 0.0 if self.silent_since is None else time.monotonic() - self.silent_since



def death_after_readiness(manager: ServiceManager, client: InferenceClient, *, label: str,
                          since: LogMark | None, base_restarts: int, log_lines: int,
                          gpus: tuple[int, ...] = ()) -> ServiceCrashed | ServiceRestarted | None:
    """After a test: did the ready service die or restart (more than `base_restarts`)? One cheap state read;
    one connect for a service attached by URL (a refusal after readiness is conclusive). Its log since
    `since`."""
    try:
        state = manager.state()
    except TransportError:
        return None
    if state.running is None:  # attached by URL: a refusal after readiness is conclusive
        refused = client.refuses_connections(LIVENESS_TIMEOUT_S)
        how = "a TCP connect to its address was refused"
        if refused is None:  # behind a proxy from the environment: ask over HTTP
            refused = HttpLiveness(client).probe() == "refused"
            how = "seen over HTTP: connection refused"
        if not refused:
            return None
        return ServiceGone(label, Death(detail=how), seen="connections refused after it had passed readiness")
    if state.death is not None:
        time.sleep(0.2)
        log = manager.logs_since(since, log_lines)
        return ServiceCrashed(label, state.death, log,
                              ranks=tuple(rank_faults_in_log(log, gpus, when="serving")))
    if state.restarts > base_restarts:
        return ServiceRestarted(label, base_restarts, state.restarts, manager.logs_since(since, log_lines))
    return None
