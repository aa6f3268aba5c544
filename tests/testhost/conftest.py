"""Test-host self-tests: loads the fixtures of ``testhost_plugin.py`` (``testhost``,
``testhost_factory``) unless tests/conftest.py already loaded them as a plugin."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("testhost_plugin"):
        config.pluginmanager.import_plugin("testhost_plugin")
