"""The self-tests' own defaults. The repository's pyproject.toml sets no pytest-timeout limit, because one would
also cap the suites run from this clone (their readiness budgets are minutes); the self-tests get 300 s each."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

SELF_TEST_TIMEOUT_S = 300


def pytest_configure(config: pytest.Config) -> None:
    # A shell without job control starts a background job (`bash .ci/run &`) with SIGINT ignored, and an ignored
    # signal stays ignored across exec: the runs the Ctrl-C tests interrupt would never see their SIGINT. A
    # handler (unlike SIG_IGN) is reset to the default at exec, so every child gets Python's usual Ctrl-C again.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(trylast=True)  # the final order: after every other conftest's and plugin's
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SELF_TEST_TIMEOUT_S))
    # The `heavy` tests first, each group in collection order (a stable sort). xdist's `load` hands each worker an
    # eighth of the collection as its first block; in collection order the second block holds most of tests/e2e,
    # so the run's balance hung on that block staying under half the work (xdist's scheduler replayed over the
    # measured durations: ~1550 of ~1870 s a worker), and a run of fewer tests ended on whichever minute-long
    # test came last. First, they go out while the queue is long, and a run ends on short tests on both workers.
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


@pytest.fixture
def own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Markers, locks and logs of this test's runs in a folder of its own: a marker another run left behind (one
    killed by a timeout, its orphan reaped only by the next run on that host) must not pass for this run's."""
    monkeypatch.setenv("DFLASH_STATE_DIR", str(tmp_path / "dflash-state"))
