"""Which environment a service's SGLANG_DIAG_BYPASS_HEALTH_GENERATE is read from: the profile's env for every
kind, and the whole environment this run started it with where its manager says it (a local process inherits
this run's own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun
from pytest_dflash.services.health import BYPASS_ENV


def _handle(tmp_path: Path, service: str):  # type: ignore[no-untyped-def]
    (tmp_path / "h.toml").write_text(
        '[host]\nname = "h"\nconnection = "local://"\n\n'
        '[services.proc]\nkind = "process"\nalgorithm = "NONE"\nurl = "http://127.0.0.1:1"\n'
        'command = ["{python}", "-c", "import time; time.sleep(30)"]\n\n'
        '[services.attached]\nkind = "external"\nalgorithm = "NONE"\nurl = "http://127.0.0.1:2"\n')
    profile = load_profile(tmp_path / "h.toml")
    return DflashRun({"h": profile}, RunOptions(provision=True), "r1").host("h").service(service)


def test_a_process_this_run_started_inherits_the_bypass_from_this_runs_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BYPASS_ENV, "1")
    handle = _handle(tmp_path, "proc")
    assert handle.health_bypassed is None  # not started yet: no environment of its own
    handle.manager.start()
    try:
        assert handle.manager.started_env is not None and handle.manager.started_env[BYPASS_ENV] == "1"
        why = handle.health_bypassed
        assert why is not None and why.startswith(f"{BYPASS_ENV}=1 in the environment this run started it with")
    finally:
        handle.manager.stop()


def test_an_attached_server_does_not_take_this_runs_environment_for_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BYPASS_ENV, "1")
    handle = _handle(tmp_path, "attached")
    assert handle.manager.started_env is None and handle.health_bypassed is None
