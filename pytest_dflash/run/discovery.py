"""What an attached server runs, read before tests are selected.

`--attach URL` and `kind = "external"` services without an `algorithm` (AUTO) are asked once, at configure
time, for /server_info's speculative_algorithm, so that speculative-only tests are never collected for a plain
server (and the algorithm filter applies to attached servers as to provisioned ones). One read-only GET per
service, in parallel across services. A server that refuses connections is not up yet (a deploy pipeline
attaches right after a restart): it is asked again every 0.25 s until it answers, up to WAIT_UP_S (at most the
service's ready_timeout). A transient answer (HTTP 5xx, 429, a timeout, a dropped connection) is asked again
within the total deadline (client/inference.py `metadata_get`); any other failure (an HTTP error, garbage) is
an answer at once. Only "not served" (404, 405, 410; not 501: SGLang never answers it, a proxy in between
does) on both paths means "not SGLang: plain". The GETs of both names share one total deadline of
DISCOVERY_TIMEOUT_S, retries included (not per read: a server dripping /server_info a byte every 2 s is cut
off there, and the error says how far it got; not per name: /get_server_info gets what /server_info left of
it), so discovery ends within WAIT_UP_S + 5 s. An answer that cannot be had leaves the service AUTO with the
reason, and its service-layer test fails with it.

Under xdist the controller asks and the workers take its answers (workerinput), so that every worker collects
the same tests.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Mapping

import httpx

from pytest_dflash.client.bodies import answer_json
from pytest_dflash.client.inference import NOT_SERVED, InferenceClient
from pytest_dflash.config.profiles import AUTO, HostProfile, ServiceSpec
from pytest_dflash.errors import ApiError
from pytest_dflash.scrub.bounds import LINE_BYTES, scrub

DISCOVERY_TIMEOUT_S = 5.0
WAIT_UP_S = 180.0  # how long a server that refuses connections may take to open its port
PROGRESS_EVERY_S = 10.0
INFO_CAP = 256 * 1024  # /server_info is ~31 KB on SGLang 0.5.17; anything far bigger is not it

# Why an attached server that answers no /server_info (404 on both names) is selected as plain: nothing tells
# a server that is not SGLang from a gateway in front of SGLang that routes only the OpenAI API.
UNKNOWN_ALGORITHM = ("it answers no /server_info (not SGLang, or a gateway in front of it): no speculative "
                     "check was selected for it; declare what it serves with --attach-algorithm ALGORITHM (a "
                     "profile: `algorithm`), and attach to the SGLang server itself, not a gateway")
Answers = dict[str, dict[str, str]]  # "host/service" -> {"algorithm": ...} or {"error": ...}


def pending(profiles: Mapping[str, HostProfile]) -> list[tuple[str, ServiceSpec]]:
    return [(f"{host}/{name}", spec) for host, profile in profiles.items()
            for name, spec in profile.services.items() if spec.algorithm == AUTO]


def ask(spec: ServiceSpec, timeout_s: float = DISCOVERY_TIMEOUT_S) -> dict[str, str]:
    """{"algorithm": "DFLASH" | "NONE" | ...} from the server's /server_info, or {"error": why, "cause": ...}.

    Both names together are bounded by `timeout_s` of TOTAL time (client/deadline.py, `metadata_first`), so
    a server that drips its answer a byte at a time, or answers one name late and never the other, cannot
    hold the run in pytest_configure."""
    url = spec.url.rstrip("/")
    key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
    timeout = httpx.Timeout(timeout_s, connect=min(5.0, timeout_s))
    try:
        with InferenceClient(url, service=spec.name, timeout=timeout, api_key=key,
                             limit_name="the discovery timeout") as client:
            try:
                # one deadline for both names (the older one gets what is left): client/inference.py
                path, response = client.metadata_first(("/server_info", "/get_server_info"),
                                                        timeout_s=timeout_s, max_bytes=INFO_CAP)
            except ApiError as exc:
                if exc.cause == "too-large":
                    return {"error": f"GET {exc.endpoint} sent more than {INFO_CAP // 1024} KB: not SGLang's "
                                     f"server_info"}
                return {"error": scrub(f"GET {exc.endpoint}: {exc.message}", 300, "discovery"),
                        "cause": exc.cause}
            if response.status_code not in NOT_SERVED:
                if response.status_code != 200:
                    return {"error": f"GET {path} answered HTTP {response.status_code}"}
                try:
                    info = answer_json(response, spec.name, path)
                except ApiError as exc:  # not JSON, or nested too deep to read
                    return {"error": scrub(f"GET {path}: {exc.message}", 300, "discovery")}
                if not isinstance(info, dict):
                    return {"error": f"GET {path} did not answer a JSON object"}
                return {"algorithm": str(info.get("speculative_algorithm") or "NONE").upper()}
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": scrub(f"{type(exc).__name__}: {exc}", 300, "discovery")}
    return {"algorithm": "NONE", "note": UNKNOWN_ALGORITHM}


def ask_when_up(key: str, spec: ServiceSpec, timeout_s: float = DISCOVERY_TIMEOUT_S,
                wait_up_s: float = WAIT_UP_S, stop: threading.Event | None = None) -> dict[str, str]:
    """ask(), again every 0.25 s while the server refuses connections (not up yet), within the wait budget.
    `stop` set (the run was interrupted) ends the wait at the next retry."""
    stop = stop or threading.Event()
    started = time.monotonic()
    deadline = started + min(wait_up_s, spec.ready_timeout_s)
    next_say = started + PROGRESS_EVERY_S
    while True:
        answer = ask(spec, timeout_s)
        refused = answer.get("cause") == "refused"
        now = time.monotonic()
        if not refused or now >= deadline or stop.is_set():
            return answer
        if now >= next_say:
            print(f"[dflash] {key}: waiting {now - started:.0f}s for {spec.display_url} to answer "
                  "/server_info (connection refused; its algorithm selects its tests)", file=sys.stderr,
                  flush=True)
            next_say = now + PROGRESS_EVERY_S
        stop.wait(0.25)


def discover(profiles: Mapping[str, HostProfile], timeout_s: float = DISCOVERY_TIMEOUT_S,
             wait_up_s: float = WAIT_UP_S) -> Answers:
    """Ask every AUTO service at once; the answers keyed "host/service"."""
    todo = pending(profiles)
    if not todo:
        return {}
    stop = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(todo)))
    try:
        futures = {key: pool.submit(ask_when_up, key, spec, timeout_s, wait_up_s, stop) for key, spec in todo}
        answers = {key: future.result() for key, future in futures.items()}
    finally:
        # Ctrl-C / SIGTERM (a KeyboardInterrupt here) must not wait out WAIT_UP_S for servers still not up:
        # the retry loops stop at once and at most one GET (DISCOVERY_TIMEOUT_S) is left in flight per thread.
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
    for key, spec in todo:
        # one line now: its service-layer test fails with it later (or is blocked)
        if "error" in answers[key]:
            print(scrub(f"[dflash] {key}: {spec.display_url}/server_info could not be read: "
                        f"{answers[key]['error']}", LINE_BYTES, "discovery"), file=sys.stderr, flush=True)
    return answers


def apply(profiles: Mapping[str, HostProfile], answers: Answers) -> dict[str, HostProfile]:
    """The profiles with the answers in their service specs (the algorithm, else why it is unknown)."""
    out: dict[str, HostProfile] = {}
    for host, profile in profiles.items():
        services = dict(profile.services)
        for name, spec in profile.services.items():
            answer = answers.get(f"{host}/{name}")
            if spec.algorithm != AUTO or answer is None:
                continue
            if "algorithm" in answer:
                services[name] = dataclasses.replace(spec, algorithm=answer["algorithm"],
                                                     algorithm_unknown=answer.get("note"))
            else:
                services[name] = dataclasses.replace(
                    spec,
                    discovery_error=f"{spec.display_url}/server_info could not be read before the tests were "
                                    f"selected ({answer.get('error')}): its algorithm is unknown, so no "
                                    "algorithm-specific test was selected for it")
        out[host] = (dataclasses.replace(profile, services=services) if services != profile.services
                     else profile)
    return out


__all__ = ["DISCOVERY_TIMEOUT_S", "UNKNOWN_ALGORITHM", "WAIT_UP_S", "apply", "ask", "ask_when_up", "discover",
           "pending"]
