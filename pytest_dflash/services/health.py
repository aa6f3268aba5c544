"""What SGLang's health routes can be trusted to say, by release (read from its wheels: sglang-versions.md).

* `/health` and `/health_generate` run a 1-token generation through the scheduler: 200 as soon as any output
  leaves it. From 0.5.19 on, `SGLANG_DIAG_BYPASS_HEALTH_GENERATE` makes both answer 200 without one, once the
  server is up (0.5.19 `sglang/srt/entrypoints/http_server.py:680`, "Let an external E2E driver establish a
  balanced DP batch before health traffic"): a wedged engine then still answers 200. `health_bypass` says
  when a service's environment sets it (SGLang's `EnvBool`, `sglang/srt/environ.py:143`: "true", "1",
  "yes", "y", any case; anything else is false).
* `GET /ready` (0.5.20+, `http_server.py:662`): 200 when `is_ready()`: not paused (`POST /pause_generation`),
  not shutting down and the server status `Up` (503 while starting and after a failed health check, which
  marks it `UnHealthy` until one succeeds). No generation.
* `GET /ping` (the SageMaker route): 200 always up to 0.5.22; from 0.5.23 `is_healthy()`, "Unlike /ready, a
  paused server still reports 200" (0.5.23 `http_server.py:2190`). So on 0.5.23+ `/ready` 503 with `/ping`
  200 is a paused server; before, `/ready` 503 alone cannot tell a pause from a failed health check.

`ask_ready` asks both, without a generation, for the evidence of a request that ran out of time or a
readiness wait that stalled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.errors import ApiError

BYPASS_ENV = "SGLANG_DIAG_BYPASS_HEALTH_GENERATE"
BYPASS_SINCE = (0, 5, 19)
READY_SINCE = (0, 5, 20)
PING_TELLS_HEALTH_SINCE = (0, 5, 23)
_TRUE = frozenset({"true", "1", "yes", "y"})  # EnvBool.parse: value.lower(), no strip
READY_TIMEOUT_S = 2.0  # both routes are flag checks in the HTTP process: no generation, no scheduler


def release(version: str | None) -> tuple[int, ...] | None:
    """'0.5.20' -> (0, 5, 20); '0.5.20.post1', '0.5.21rc0' -> their release numbers; None if unreadable (read
    by packaging, as the env layer reads installed versions)."""
    try:
        return Version(version).release if version else None
    except InvalidVersion:
        return None


def health_bypass(env: Mapping[str, str], *, where: str) -> str | None:
    """Why /health_generate proves nothing for a server started with `env` (None: it proves output got through
    the scheduler). `where` names the environment: "the profile's env", "this run's environment"."""
    value = env.get(BYPASS_ENV)
    if value is None or value.lower() not in _TRUE:
        return None
    return (f"{BYPASS_ENV}={value} in {where}: SGLang 0.5.19+ then answers /health and /health_generate 200 "
            "without a generation")


def has_ready_route(version: str | None) -> bool:
    """Whether the server may serve GET /ready: 0.5.20+, or a version not known (asked: a 404 says no)."""
    known = release(version)
    return known is None or known >= READY_SINCE


@dataclass(frozen=True)
class ReadyAnswer:
    """GET /ready (and, when it says 503 on 0.5.23+, GET /ping) of one server."""

    status: int | None  # None: no answer within READY_TIMEOUT_S
    ping: int | None = None  # /ping when asked
    paused: bool = False  # 0.5.23+: /ready 503 while /ping 200
    error: str = ""

    @property
    def not_ready(self) -> bool:
        return self.status == 503

    def describe(self) -> str:
        """'GET /ready: 200 (up, healthy, not paused)', 'GET /ready: 503 (paused ...)'."""
        if self.status is None:
            return f"GET /ready: no answer ({self.error})"
        if self.status == 200:
            return "GET /ready: 200 (up, healthy and not paused: SGLang takes new requests)"
        if self.status != 503:
            return f"GET /ready: {self.status}"
        if self.paused:
            return ("GET /ready: 503 while GET /ping: 200 (SGLang 0.5.23+: paused, by POST "
                    "/pause_generation; POST /continue_generation resumes it)")
        if self.ping == 503:
            return ("GET /ready: 503, GET /ping: 503 (not healthy: shutting down, or marked unhealthy by "
                    "a failed health check, which a paused engine fails too)")
        return ("GET /ready: 503 (not taking new requests: paused by POST /pause_generation, shutting down, "
                "or marked unhealthy by a failed health check)")


def ask_ready(client: InferenceClient, version: str | None) -> ReadyAnswer | None:
    """GET /ready, and GET /ping where the release says /ping tells a pause from ill health; None where the
    server has no /ready (a release before 0.5.20, a 404: nothing to say)."""
    if not has_ready_route(version):
        return None
    try:
        status = client.request("GET", "/ready", timeout_s=READY_TIMEOUT_S).status_code
    except ApiError as exc:
        return ReadyAnswer(None, error=exc.message)
    if status in (404, 405):
        return None
    known = release(version)
    if status != 503 or known is None or known < PING_TELLS_HEALTH_SINCE:
        return ReadyAnswer(status)
    try:
        ping: int | None = client.request("GET", "/ping", timeout_s=READY_TIMEOUT_S).status_code
    except ApiError:
        ping = None
    return ReadyAnswer(status, ping, paused=ping == 200)


__all__ = ["BYPASS_ENV", "ReadyAnswer", "ask_ready", "has_ready_route", "health_bypass", "release"]
