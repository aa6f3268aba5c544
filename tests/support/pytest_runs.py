"""What every self-test that runs pytest in a subprocess checks of the run: its verdict file, and that it did
not crash (shared by tests/e2e and tests/containers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# A host whose one service is an external DFLASH server on a closed port: for the tests of the plugin's own
# bookkeeping (verdicts, gates, fleets), which need no server
EXTERNAL_DFLASH_PROFILE = """
[host]
connection = "local://"

[services.dflash]
kind = "external"
algorithm = "DFLASH"
url = "http://127.0.0.1:9"
"""


def external_host(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, test_file: str) -> Path:
    """pytester's folder with `test_file` as test_hosts.py and the host gpu-a (EXTERNAL_DFLASH_PROFILE), in an
    environment of its own (state folder; no step summary, no PYTEST_ADDOPTS of the harness)."""
    monkeypatch.setenv("DFLASH_STATE_DIR", str(pytester.path / "state"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makepyfile(test_hosts=test_file)
    path = pytester.path / "gpu-a.toml"
    path.write_text(EXTERNAL_DFLASH_PROFILE)
    return path


def run_on_profile(pytester: pytest.Pytester, profile: Path, *args: str) -> pytest.RunResult:
    """`pytest --host PROFILE` in a subprocess, its verdicts in pytester's reports/."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", str(profile),
                                         f"--dflash-report={pytester.path / 'reports'}", *args)


def verdict(directory: Path, host: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / f"{host}.verdict.json").read_text())
    return data


def assert_no_crash(result: pytest.RunResult) -> None:
    """No INTERNALERROR, no plugin traceback."""
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text, text[-3000:]
