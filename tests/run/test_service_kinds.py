"""services/registry.py: a service kind is one file and one registration. A tiny kind defined here (a refserver
it starts itself, on a port it picks) runs through the real run state: provisioning takes the host lock and reaps
through the kind, readiness waits on it, the run's cleanup stops it; run/state.py is not touched for it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.errors import ServiceError
from pytest_dflash.run.state import DflashRun, RunOptions
from pytest_dflash.services.base import Kind, LogMark, ServiceHost, ServiceState, death_from_returncode
from pytest_dflash.services.process import free_port
from pytest_dflash.services.registry import KINDS, make_manager, register

REAPED: list[str] = []


@dataclasses.dataclass
class TinyService:
    """A refserver child process: the whole of a kind's manager."""

    spec: ServiceSpec
    log_path: Path
    port: int = dataclasses.field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def provisioned(self) -> bool:
        return self.proc is not None

    @property
    def provisionable(self) -> bool:
        return True

    @property
    def native_api(self) -> bool | None:
        return True

    def attach(self) -> str | None:
        return None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "pytest_dflash.refserver", "--host", "127.0.0.1",
                                          "--port", str(self.port), "--speculative-algorithm", "NONE"],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    def state(self) -> ServiceState:
        if self.proc is None:
            return ServiceState(running=False)
        code = self.proc.poll()
        if code is None:
            return ServiceState(running=True, pid=self.proc.pid)
        return ServiceState(running=False, death=death_from_returncode(code), pid=self.proc.pid)

    def log_mark(self) -> LogMark:
        return LogMark(time.time(), self.log_path.stat().st_size if self.log_path.exists() else 0)

    def logs_since(self, mark: LogMark | None, lines: int) -> str:
        data = self.log_path.read_bytes()[mark.offset if mark else 0:] if self.log_path.exists() else b""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    def describe(self) -> dict[str, str]:
        return {"kind": "tiny", "url": self.url}


def _make(spec: ServiceSpec, host: ServiceHost) -> TinyService:
    return TinyService(spec, host.log_dir / f"{host.name}.{spec.name}.{host.run_id}.log")


def _reap(host: ServiceHost, specs: list[ServiceSpec]) -> list[str]:
    REAPED.append(f"{host.name}: {[spec.name for spec in specs]}")
    return [f"tiny: nothing left on {host.name}"]


TINY = Kind("tiny", make=_make, reap=_reap)


@pytest.fixture
def tiny_kind() -> Iterator[Kind]:
    register(TINY)
    yield TINY
    del KINDS[TINY.name]


def tiny_host(tmp_path: Path) -> HostProfile:
    # A profile file names only the built-in kinds: the tiny service's spec is made here.
    spec = ServiceSpec(name="s", kind=cast(Any, "tiny"), url="http://127.0.0.1:{port}", algorithm="NONE",
                       ready_timeout_s=60.0)
    return HostProfile(name="h", source=tmp_path / "h.toml", connection="local://", python=sys.executable,
                       services={"s": spec}, provision="always")


def test_a_kind_registered_in_one_place_runs_through_the_run_state(tiny_kind: Kind, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_STATE_DIR", str(tmp_path / "state"))
    run = DflashRun({"h": tiny_host(tmp_path)}, RunOptions(provision=True), f"tiny{os.getpid()}")
    handle = run.host("h").service("s")
    assert isinstance(handle.manager, TinyService)
    try:
        report = handle.ensure_ready()
        assert handle.manager.provisioned and handle.url == handle.manager.url
        assert report.greedy_s is not None and report.sampled_s is not None
        assert handle.native  # the kind said SGLang's native API: /server_info was read
        assert handle.check_alive() is None
        assert REAPED == ["h: ['s']"] and "tiny: nothing left on h" in run.host("h").notes
        proc = handle.manager.proc
    finally:
        assert run.cleanup() == []
    assert proc is not None and proc.poll() is not None and not handle.manager.provisioned


def test_a_kind_name_is_registered_once_and_an_unknown_one_is_refused(tiny_kind: Kind, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'tiny' is already registered"):
        register(TINY)
    run = DflashRun({"h": tiny_host(tmp_path)}, RunOptions(), "unknown")
    spec = dataclasses.replace(tiny_host(tmp_path).services["s"], kind=cast(Any, "nonesuch"))
    with pytest.raises(ServiceError, match="h/s: unknown service kind 'nonesuch' \\(known: process, systemd, "
                                           "container, external, tiny\\)"):
        make_manager(spec, run.host("h"))
