"""A report's `dflash` property carries the host's facts only when they changed since this process last sent
them; the controller's VerdictBuilder merges reports, so the verdict is the one the full state would give."""

from __future__ import annotations

import copy
import types
from typing import Any

from pytest_dflash.evidence.attach import _changed
from pytest_dflash.report.verdict import VerdictBuilder


def info(service_facts: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    return {"host": "ct200", "layer": "generation", "services": ["dflash"], "blocked": False, "diagnosis": [],
            "service_facts": service_facts, "notes": [], "metrics": metrics, "facts": {}}


def test_only_changes_are_sent_and_the_verdict_is_the_full_states() -> None:
    host: Any = types.SimpleNamespace(reported={})
    facts = {"dflash": {"url": "http://h:30000", "algorithm": "DFLASH", "ready": {"total_s": 2.5}}}
    metrics: dict[str, Any] = {"perf.dflash.tok_s": 900.0}
    sent = []
    for step in range(4):
        if step == 2:
            facts["dflash"]["accept_length"] = 3.2  # changed in place: seen through the JSON comparison
            metrics["perf.dflash.tok_s"] = 950.0
        sent.append(copy.deepcopy((_changed(host, "service_facts", facts), _changed(host, "metrics", metrics))))
    assert sent[0] == ({"dflash": {"url": "http://h:30000", "algorithm": "DFLASH", "ready": {"total_s": 2.5}}},
                       {"perf.dflash.tok_s": 900.0})
    assert sent[1] == ({}, {}) and sent[3] == ({}, {})
    assert sent[2][0]["dflash"]["accept_length"] == 3.2 and sent[2][1] == {"perf.dflash.tok_s": 950.0}

    deltas, full = VerdictBuilder("r"), VerdictBuilder("r")
    states = [copy.deepcopy(sent[0])] * 2 + [({"dflash": {**sent[0][0]["dflash"], "accept_length": 3.2}},
                                               {"perf.dflash.tok_s": 950.0})] * 2
    for step, ((service_facts, metric), state) in enumerate(zip(sent, states, strict=True)):
        deltas.add(f"t{step}", "call", "passed", info(service_facts, metric), "")
        full.add(f"t{step}", "call", "passed", info(*copy.deepcopy(state)), "")
    assert deltas.hosts["ct200"].services == full.hosts["ct200"].services
    assert deltas.hosts["ct200"].metrics == full.hosts["ct200"].metrics == {"perf.dflash.tok_s": 950.0}
