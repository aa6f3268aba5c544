"""pytest plugin loaded into the inner runs of the scenario tests (``-p dflash_scenario_recorder``).

Writes one JSON line per event to ``$DFLASH_SCENARIO_EVENTS``: when each test started (``logstart``,
before its setup, so before the plugin's journal mark) and when each phase's report existed (after
the plugin attached its evidence and diagnosis). The scenario tests compare these times with the
guest journal's (the guest shares this machine's clock).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("DFLASH_SCENARIO_EVENTS")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**record, "t": time.time()}) + "\n")


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _write({"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome})
