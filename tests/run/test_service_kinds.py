"""services/registry.py: a service kind is one file and one registration. A tiny kind defined here (a refserver
it starts itself, on a port it picks, logging to the file its own profile key names) is named by a profile file:
its table's key is read and checked by its own reader, the JSON Schema knows it, and it runs through the real run
state: provisioning takes the host lock and reaps through the kind, readiness waits on it, the run's cleanup stops
it. No other file of the package is touched for it (config/ and run/state.py know kinds only through the
registry)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import jsonschema
import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.config.schema import profile_schema
from pytest_dflash.config.tables import kinds
from pytest_dflash.config.tables.kinds import KIND_TABLES, KindTable
from pytest_dflash.config.tables.reader import Table
from pytest_dflash.errors import DflashError, InventoryError, ServiceError
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun
from pytest_dflash.services.base import Kind, LogMark, ServiceHost, ServiceState, death_from_returncode
from pytest_dflash.services.process import free_port
from pytest_dflash.services.registry import KINDS, make_manager, register, unregister

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

    @property
    def started_env(self) -> Mapping[str, str] | None:
        return None

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


@dataclasses.dataclass(frozen=True)
class TinySettings:
    """What a tiny service's own keys say (`ServiceSpec.settings`)."""

    log_name: str


def _make(spec: ServiceSpec, host: ServiceHost) -> TinyService:
    assert isinstance(spec.settings, TinySettings)
    return TinyService(spec, host.log_dir / f"{spec.settings.log_name}.{host.run_id}.log")


def _read_table(table: Table, spec: ServiceSpec, host: HostProfile, profile_dir: Path) -> ServiceSpec:
    """Its own key: `log_name`, required, a plain file name."""
    log_name = table.get("log_name", str, required=True)
    assert log_name is not None
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", log_name):
        raise table.fail("log_name", f"expected a file name (letters, digits, '_', '-', '.'), got {log_name!r}")
    return dataclasses.replace(spec, settings=TinySettings(log_name))


def _reap(host: ServiceHost, specs: list[ServiceSpec]) -> list[str]:
    REAPED.append(f"{host.name}: {[spec.name for spec in specs]}")
    return [f"tiny: nothing left on {host.name}"]


# It picks its own port, so `{port}` in its URL needs no fixed `port`.
TINY = Kind("tiny", make=_make, reap=_reap,
            table=KindTable("tiny", read=_read_table, auto_port=True,
                            keys={"log_name": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+$"}},
                            schema={"required": ["log_name"]}))


@pytest.fixture
def tiny_kind() -> Iterator[Kind]:
    register(TINY)
    yield TINY
    unregister(TINY.name)


def tiny_profile(tmp_path: Path, *lines: str) -> Path:
    """A profile file of host h with one service s, its table's lines given."""
    path = tmp_path / "h.toml"
    path.write_text("\n".join(["[host]", 'connection = "local://"', f"python = {json.dumps(sys.executable)}",
                                'provision = "always"', "", "[services.s]", *lines]) + "\n")
    return path


TINY_LINES = ('kind = "tiny"', 'algorithm = "NONE"', 'log_name = "tiny-s"', "ready_timeout = 60")


def tiny_host(tmp_path: Path) -> HostProfile:
    return load_profile(tiny_profile(tmp_path, *TINY_LINES))


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
    spec = dataclasses.replace(tiny_host(tmp_path).services["s"], kind="nonesuch")
    with pytest.raises(ServiceError, match="h/s: unknown service kind 'nonesuch' \\(known: process, systemd, "
                                           "container, external, tiny\\)"):
        make_manager(spec, run.host("h"))


def test_a_profile_names_the_kind_and_its_own_key_is_read_by_its_table(tiny_kind: Kind, tmp_path: Path) -> None:
    spec = tiny_host(tmp_path).services["s"]
    assert spec.kind == "tiny" and spec.settings == TinySettings("tiny-s")
    assert spec.url == "http://127.0.0.1:{port}" and spec.port is None  # auto_port: the kind picks one


@pytest.mark.parametrize(("lines", "message"), [
    (TINY_LINES[:2], "services.s.log_name: missing required key (expected a string)"),
    ((*TINY_LINES[:2], 'log_name = "../x"'),
     "services.s.log_name: expected a file name (letters, digits, '_', '-', '.'), got '../x'"),
    ((*TINY_LINES, "log_nam = 1"), "services.s.log_nam: unknown key (did you mean 'log_name'?)"),
    # its own key is unknown on a service of another kind
    (('kind = "process"', 'command = ["x"]', 'algorithm = "NONE"', 'log_name = "x"'),
     "services.s.log_name: unknown key (did you mean 'log_file'?)"),
    (('kind = "nonesuch"', 'algorithm = "NONE"'),
     "services.s.kind: expected one of process, systemd, container, external, tiny, got 'nonesuch'"),
    # the other kinds' rules still hold (only the kinds that say so get an automatic port)
    (('kind = "container"', 'algorithm = "NONE"', 'url = "http://127.0.0.1:{port}"'),
     "services.s.port: expected a fixed port: only process or tiny services get an automatic one"),
])
def test_a_bad_table_of_the_kind_is_a_one_line_profile_error(tiny_kind: Kind, tmp_path: Path,
                                                               lines: tuple[str, ...], message: str) -> None:
    path = tiny_profile(tmp_path, *lines)
    with pytest.raises(InventoryError) as info:
        load_profile(path)
    assert str(info.value) == f"{path}: {message}"


def test_the_schema_knows_the_kind_and_its_own_key(tiny_kind: Kind) -> None:
    schema = profile_schema()
    service = schema["$defs"]["service"]
    assert service["properties"]["kind"]["enum"] == ["process", "systemd", "container", "external", "tiny"]
    assert service["properties"]["log_name"] == {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+$"}
    validator = jsonschema.Draft202012Validator(schema)
    host = {"connection": "local://"}
    assert validator.is_valid({"host": host, "services": {"s": {"kind": "tiny", "algorithm": "NONE",
                                                                "log_name": "x"}}})
    assert not validator.is_valid({"host": host, "services": {"s": {"kind": "tiny", "algorithm": "NONE"}}})
    assert not validator.is_valid({"host": host, "services": {"s": {"kind": "process", "algorithm": "NONE",
                                                                    "command": ["x"], "log_name": "x"}}})


def test_unregistered_the_kind_is_unknown_again(tmp_path: Path) -> None:
    register(TINY)
    unregister(TINY.name)
    assert "tiny" not in KINDS and "tiny" not in KIND_TABLES
    with pytest.raises(InventoryError, match="services.s.kind: expected one of process, systemd, container, "
                                             "external, got 'tiny'"):
        tiny_host(tmp_path)


def test_without_the_registry_a_profile_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config/ cannot import services/: reading a profile before services/registry.py registered the kinds says
    so (the plugin and the command import it)."""
    monkeypatch.setattr(kinds, "KIND_TABLES", {})
    with pytest.raises(DflashError, match=r"no service kinds are registered: import pytest_dflash\.services\.registry"):
        tiny_host(tmp_path)
    with pytest.raises(DflashError, match="no service kinds are registered"):
        profile_schema()
