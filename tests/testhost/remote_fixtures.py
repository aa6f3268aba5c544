"""Fixtures of the scenario tests; test modules load them with ``pytest_plugins = ["remote_fixtures"]``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from remote_helpers import Guest, SuiteRun, suite_runs
from testhost import TestHost


@pytest.fixture
def guest(testhost: TestHost) -> Iterator[Guest]:
    """The session's test host, seen from outside the plugin; units the test tracks are removed afterwards."""
    seen = Guest(testhost)
    try:
        yield seen
    finally:
        seen.cleanup()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Callable[..., SuiteRun]]:
    """runs(profile, *pytest_args, name=..., env=..., suites=...) -> a started SuiteRun (cleaned up after the test)."""
    with suite_runs(tmp_path) as make:
        yield make
