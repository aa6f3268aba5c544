"""The fixtures dflash tests ask for, and the ONE path that makes a service ready or blocks the test.

Registered through `pytest_dflash.plugin.pytest_plugins`. Every fixture is parametrized at collection
(run/collection.py): `dflash_host` per host, `dflash_service` / `dflash_service_raw` per host/service,
`dflash_pair` per (reference, compared) pair of a host's [parity] table.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_dflash.errors import DflashError
from pytest_dflash.run.blocking import Failure, blocked_reason
from pytest_dflash.run.handle import ServiceHandle, readiness_error_summary
from pytest_dflash.run.stash import HANDLES_KEY, RUN_KEY
from pytest_dflash.run.state import DflashRun, HostContext
from pytest_dflash.scrub.bounds import failure_text


def current_run(config: pytest.Config) -> DflashRun:
    """The run of this pytest process; a dflash test without a target fails with what to pass."""
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.profiles:
        pytest.fail("pytest-dflash: no target (pass --host, --attach or --fleet)", pytrace=False)
    return run


def use_service(node: pytest.Item | None, handle: ServiceHandle) -> None:
    """Record that the test uses `handle`: its log and state are the test's evidence, its death the test's."""
    if node is None:
        return
    handle.current_test = node.nodeid  # a request that runs out of time fails the service in this test
    handles = node.stash.setdefault(HANDLES_KEY, [])
    if handle not in handles:
        handles.append(handle)


def ready_or_blocked(handle: ServiceHandle, node: pytest.Item | None, *, role: str = "") -> ServiceHandle:
    """Make `handle` ready for the test `node`, or end the test.

    The first test to see a service fail to become ready FAILS with the failure and the service log (also
    when the failure happened outside any test, e.g. a peer started alongside another service); every later
    test that needs it is skipped as blocked, naming that test and the failure (no second wait).
    """
    use_service(node, handle)
    try:
        handle.ensure_ready()
    except DflashError as exc:
        reported = handle.failure_reported_by
        test = node.nodeid if node is not None else "?"
        if reported is not None and reported != test:
            # worded as the layer book's blocks of the same failure: one root cause, one line per host
            pytest.skip(blocked_reason(Failure(handle.host.name, "service", handle.name, reported,
                                               readiness_error_summary(exc))))
        handle.failure_reported_by = test
        what = f"{handle.label} ({role}) is not ready: " if role else ""
        pytest.fail(what + failure_text(exc), pytrace=False)
    return handle


@pytest.fixture
def dflash_run(request: pytest.FixtureRequest) -> DflashRun:
    """The run: options, hosts, layer book."""
    return current_run(request.config)


@pytest.fixture
def dflash_host(request: pytest.FixtureRequest) -> HostContext:
    """The host under test (parametrized over every --host / --attach / fleet host)."""
    return current_run(request.config).host(str(request.param))


@pytest.fixture
def dflash_service_raw(request: pytest.FixtureRequest) -> ServiceHandle:
    """A service handle that is NOT made ready first (for the service layer's own readiness tests)."""
    host, _, service = str(request.param).partition("/")
    handle = current_run(request.config).host(host).service(service)
    use_service(request.node, handle)
    return handle


@pytest.fixture
def dflash_service(request: pytest.FixtureRequest) -> ServiceHandle:
    """A ready service (a real greedy and sampled generation succeeded), parametrized host/service."""
    host, _, service = str(request.param).partition("/")
    return ready_or_blocked(current_run(request.config).host(host).service(service), request.node)


@pytest.fixture
def dflash_client(dflash_service: ServiceHandle) -> Any:
    """The HTTP client of `dflash_service`."""
    return dflash_service.client


@pytest.fixture
def dflash_pair(request: pytest.FixtureRequest) -> tuple[ServiceHandle, ServiceHandle]:
    """(reference, compared) ready services of one host, from the profile's [parity] table."""
    host, _, pair = str(request.param).partition("/")
    reference, _, compared = pair.partition("~")
    context = current_run(request.config).host(host)
    return (ready_or_blocked(context.service(reference), request.node),
            ready_or_blocked(context.service(compared), request.node))
