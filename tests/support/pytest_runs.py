"""What every self-test that runs pytest in a subprocess checks of the run: its verdict file, and that it did
not crash (shared by tests/e2e and tests/containers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def verdict(directory: Path, host: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / f"{host}.verdict.json").read_text())
    return data


def assert_no_crash(result: pytest.RunResult) -> None:
    """No INTERNALERROR, no plugin traceback."""
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text, text[-3000:]
