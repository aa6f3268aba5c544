"""Fixtures for the readiness and client tests: one real refserver process shared by the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_dflash.refserver.launch import RefServerProcess


@pytest.fixture(scope="module")
def refserver() -> Iterator[RefServerProcess]:
    """A healthy DFLASH refserver with /metrics (ready: /health_generate answered 200)."""
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--enable-metrics") as server:
        yield server
