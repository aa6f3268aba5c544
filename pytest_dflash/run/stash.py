"""The run's keys in `config.stash` / `item.stash`: one place, so hooks of every module can share state
without importing the plugin module (no import cycles)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the keys are typed; importing these at run time would make import cycles
    from pytest_dflash.config.profiles import HostProfile
    from pytest_dflash.report.session import Selection  # noqa: F401
    from pytest_dflash.report.verdict import VerdictBuilder  # noqa: F401
    from pytest_dflash.run.collection import ItemInfo  # noqa: F401
    from pytest_dflash.run.state import DflashRun, ServiceHandle  # noqa: F401
    from pytest_dflash.services.base import LogMark

RUN_KEY = pytest.StashKey["DflashRun"]()
BUILDER_KEY = pytest.StashKey["VerdictBuilder"]()
GATE_KEY = pytest.StashKey[list[str]]()
EMPTY_SHARD_KEY = pytest.StashKey[str]()
NAMED_HOSTS_KEY = pytest.StashKey[tuple[str, ...]]()  # every host the run names, before --shard
TARGETS_KEY = pytest.StashKey[dict[str, "HostProfile"]]()  # the run's profiles, loaded first (report/started.py)
REPORTED_KEY = pytest.StashKey[list[str]]()
SELECTION_KEY = pytest.StashKey["Selection"]()
PREVIOUS_SIGTERM_KEY = pytest.StashKey[Any]()
PREVIOUS_SIGINT_KEY = pytest.StashKey[Any]()
# per test item
INFO_KEY = pytest.StashKey["ItemInfo"]()
MARKS_KEY = pytest.StashKey[dict[str, "LogMark"]]()
HANDLES_KEY = pytest.StashKey[list["ServiceHandle"]]()
