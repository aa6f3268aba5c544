"""The tensor-parallel ranks a verdict names (its `services.<svc>.ranks`): one line per rank that died or
stopped, with its pid and GPU, for the terminal's verdict section, the HTML verdict table and the fleet
views."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["rank_lines"]


def rank_lines(services: Mapping[str, Any]) -> list[str]:
    """'dflash: tensor-parallel rank TP1 (rank 1, pid 4242, GPU 5) died while serving: killed by SIGKILL', one
    per rank of each service (a verdict written by an older version, without `said`, is named from its
    fields)."""
    out = []
    for service, facts in sorted(services.items()):
        faults = facts.get("ranks") if isinstance(facts, Mapping) else None
        for fault in faults if isinstance(faults, list) else ():
            if not isinstance(fault, Mapping):
                continue
            said = fault.get("said") or (f"tensor-parallel rank {fault.get('label', '?')} "
                                         f"{fault.get('event', 'failed')}: {fault.get('how', '')}")
            out.append(f"{service}: {said}")
    return out
