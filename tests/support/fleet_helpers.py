"""Verdict files for the fleet tests, written by the real VerdictBuilder (the schema the plugin writes)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_dflash.config.targets import file_name
from pytest_dflash.report.verdict import VerdictBuilder

FLASHINFER = {"id": "flashinfer-sm12x-nvcc", "title": "FlashInfer JIT cannot build for SM 12.x",
              "remedy": "install CUDA 12.9+", "evidence": "sm75 or higher"}
SERVICES = {"dflash": {"algorithm": "DFLASH", "version": "0.5.17", "url": "http://127.0.0.1:30001",
                       "ready": {"total_s": 70.5}, "accept_length": 3.6}}


def make_verdict(directory: Path, host: str, outcomes: Mapping[str, str], *, run_id: str = "run1",
                 finished: float | None = None, diagnosis: Sequence[Mapping[str, str]] = (FLASHINFER,),
                 services: Mapping[str, Any] | None = None, metrics: Mapping[str, Any] | None = None,
                 facts: Mapping[str, Any] | None = None, gate: Sequence[str] = ()) -> Path:
    """One host's verdict: `outcomes` = {layer: passed|failed|blocked|skipped}."""
    builder = VerdictBuilder(run_id)
    base = {"host": host, "profile": f"hosts/{host}.toml", "connection": "local://",
            "service_facts": dict(SERVICES if services is None else services), "metrics": dict(metrics or {}),
            "facts": dict(facts or {}), "notes": []}
    for layer, outcome in outcomes.items():
        info = {**base, "layer": layer, "services": ["dflash"], "blocked": outcome == "blocked",
                "diagnosis": list(diagnosis) if outcome == "failed" else []}
        nodeid = f"suites/smoke/test_smoke.py::test_{layer}[{host}/dflash]"
        if outcome == "failed":
            builder.add(nodeid, "call", "failed", info, "ServiceCrashed: service dflash died")
        elif outcome == "blocked":
            builder.add(nodeid, "setup", "skipped", info, f"blocked: service layer failed on {host}/dflash")
        elif outcome == "skipped":
            builder.add(nodeid, "setup", "skipped", info, "no GPU")
        else:
            builder.add(nodeid, "call", "passed", info, "")
    gate_info = builder.gate(gate) if gate else None
    directory.mkdir(parents=True, exist_ok=True)
    failing = any(outcome in ("failed", "blocked") for outcome in outcomes.values())
    exit_code = 0 if (gate_info and gate_info["passed"]) or not failing else 1  # what pytest-dflash exits with
    (path,) = [p for p in builder.write(directory, exit_code=exit_code, gate=gate_info)
               if p.name == f"{file_name(host)}.verdict.json"]
    if finished is not None:
        data = json.loads(path.read_text())
        data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(finished))
        path.write_text(json.dumps(data, indent=2) + "\n")
    return path



GREEN = {"host": "passed", "service": "passed", "generation": "passed"}
BROKEN = {"host": "passed", "service": "failed", "generation": "blocked"}
