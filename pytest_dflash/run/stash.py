"""The run's keys in `config.stash` / `item.stash` that hold run state: hooks of every module share it without
importing the plugin module. A key that holds a lower package's value lives beside it (config/targets.py: the
targets and the shard; run/collection.py: an item's `ItemInfo`; report/verdict.py: the `VerdictBuilder`;
report/session.py: the `Selection`), so no module imports upwards for a key's type."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle
    from pytest_dflash.run.state import DflashRun  # noqa: F401
    from pytest_dflash.services.base import LogMark

RUN_KEY = pytest.StashKey["DflashRun"]()
GATE_KEY = pytest.StashKey[list[str]]()
REPORTED_KEY = pytest.StashKey[list[str]]()
PREVIOUS_SIGNALS_KEY = pytest.StashKey[dict[Any, Any]]()  # SIGTERM / SIGHUP -> the handler to put back
PREVIOUS_SIGINT_KEY = pytest.StashKey[Any]()
# per test item
MARKS_KEY = pytest.StashKey[dict[str, "LogMark"]]()
HANDLES_KEY = pytest.StashKey[list["ServiceHandle"]]()
