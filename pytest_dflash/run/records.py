"""The plain records a run and each of its hosts carry: the options the command line gave the run
(`RunOptions`) and what the layers learn about a host while it runs (`HostFacts`). Typed fields, no behaviour;
below run/handle.py and run/state.py so both can name them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunOptions:
    provision: bool = False
    keep: bool = False
    journal_lines: int = 200
    report_dir: Path = Path("reports")
    ready_timeout_s: float | None = None
    lock_wait_s: float = 600.0
    request_timeout_s: float = 60.0


@dataclass
class HostFacts:
    """What the layers learn about one host during the run: for each other and for the verdict. Named fields,
    not string keys, so a reader (and mypy) sees who writes what."""

    metrics: dict[str, Any] = field(default_factory=dict)  # the verdict's "metrics": perf, parity, acceptance
    # the verdict's "facts": env snapshot, driver, JIT builds
    export: dict[str, Any] = field(default_factory=dict)
    # service -> latest measured mean accept length
    accept_lengths: dict[str, float] = field(default_factory=dict)
    # the GPU layers' probe results, run once per host
    gpu_probes: dict[str, Any] = field(default_factory=dict)
