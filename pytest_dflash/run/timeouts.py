"""pytest-timeout and the plugin's own budgets: a kill by pytest-timeout is the service's failure too.

The readiness budgets (`ready_timeout`, `sampled_timeout`, --ready-timeout) bound the wait for a service;
pytest-timeout's `--timeout` / `timeout` ini bounds a whole test. When a test is killed by pytest-timeout
(signal method: the test fails with "Timeout (>Ns) from pytest-timeout.") while it waited for or used a
service, that service is marked failed: later tests that need it are skipped as blocked at once instead of
each waiting again until its own timeout. See docs/gating.md ("Timeouts").
"""

from __future__ import annotations

import re

import pytest

from pytest_dflash.errors import ServiceNotReady
from pytest_dflash.run.blocking import Failure
from pytest_dflash.run.stash import HANDLES_KEY
from pytest_dflash.run.state import DflashRun

PYTEST_TIMEOUT = re.compile(r"Timeout \(>([0-9.]+)s\) from pytest-timeout")


def record_timeout_kill(item: pytest.Item, report: pytest.TestReport, run: DflashRun, host: str) -> bool:
    """If pytest-timeout killed this test, fail the services it was using; True if it did."""
    if not report.failed:
        return False
    match = PYTEST_TIMEOUT.search(report.longreprtext)
    if match is None:
        return False
    limit = float(match.group(1))
    for handle in item.stash.get(HANDLES_KEY, []):
        phase = "becoming ready" if handle.ready is None else "serving the test"
        summary = (f"{handle.label}: killed by pytest-timeout after {limit:g}s while {phase} "
                   "(--timeout / the timeout ini key caps the test, readiness budgets included)")
        if handle.failure is None:
            handle.failure = ServiceNotReady(handle.label, limit, f"pytest-timeout ({limit:g}s) {phase}")
            handle.failure_reported_by = item.nodeid
        run.book.record_death(Failure(host, "service", handle.name, item.nodeid, summary))
    return True
