"""Recorded real outputs for the GPU layers' self-tests (see tests/data/gpu/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parents[2] / "data" / "gpu"
H200 = DATA / "h200"
CPU = DATA / "cpu-nvcc13"
REPO = Path(__file__).parents[3]
SUITES = REPO / "suites"


def load(path: Path | str) -> Any:
    """A recorded probe output (JSON), relative to tests/data/gpu/."""
    return json.loads((DATA / path).read_text(encoding="utf-8"))


def text(path: Path | str) -> str:
    return (DATA / path).read_text(encoding="utf-8", errors="replace")
