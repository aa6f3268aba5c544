"""The self-tests' own defaults. The repository's pyproject.toml sets no pytest-timeout limit, because one would
also cap the suites run from this clone (their readiness budgets are minutes); the self-tests get 300 s each."""

from __future__ import annotations

import pytest

SELF_TEST_TIMEOUT_S = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SELF_TEST_TIMEOUT_S))
