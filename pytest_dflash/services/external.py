"""A service reached only by URL (--attach, or kind = "external"): no host access, no logs.

Its state is unknown (`running=None`), which tells readiness and `check_alive` to read death and silence
over HTTP instead (services/readiness.py: `HttpLiveness`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.services.base import LogMark, ServiceState


@dataclass
class ExternalService:
    spec: ServiceSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def provisioned(self) -> bool:
        return False

    @property
    def url(self) -> str:
        return self.spec.url

    def start(self) -> None:
        """Nothing to start: an external service is only attached to."""

    def stop(self) -> None:
        """Nothing to stop."""

    def state(self) -> ServiceState:
        return ServiceState(running=None)

    def log_mark(self) -> LogMark:
        return LogMark(time.time())

    def logs_since(self, mark: LogMark | None, lines: int) -> str:
        return ""

    def describe(self) -> dict[str, str]:
        return {"kind": "external", "url": self.url, "logs": "none (no host access with --attach)",
                "liveness": "over HTTP (GET /v1/models; refused after it had answered = gone)"}
