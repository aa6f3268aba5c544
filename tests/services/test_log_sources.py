"""External services' log sources (log_command / log_file) and the container keys, read for real on this machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.errors import InventoryError
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.services.base import LogMark
from pytest_dflash.services.container import state_from_inspect
from pytest_dflash.services.external import ExternalService


def _profile(tmp_path: Path, service: str) -> Path:
    path = tmp_path / "ext.toml"
    path.write_text(f'[host]\nconnection = "local://"\npython = "{sys.executable}"\n\n[services.s]\n{service}\n')
    return path


def test_log_command_gets_since_and_keeps_the_tail(tmp_path: Path) -> None:
    profile = load_profile(_profile(tmp_path, 'kind = "external"\nalgorithm = "auto"\nurl = "http://127.0.0.1:9"\n'
                                              'log_command = "echo since={since}; seq 1 50"'))
    service = ExternalService(profile.services["s"], Transport(profile, read_only=True))
    log = service.logs_since(LogMark(0.5), 5)
    assert log.splitlines() == ["46", "47", "48", "49", "50"]
    assert "since=1970-01-01T00:00:00Z" in service.logs_since(LogMark(0.5), 100)


def test_log_file_reads_from_the_test_offset(tmp_path: Path) -> None:
    logfile = tmp_path / "server.log"
    logfile.write_text("before the test\n")
    profile = load_profile(_profile(tmp_path, f'kind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n'
                                              f'log_file = "{logfile}"'))
    service = ExternalService(profile.services["s"], Transport(profile, read_only=True))
    mark = service.log_mark()
    with logfile.open("a") as handle:
        handle.write("Scheduler hit an exception\n")
    assert service.logs_since(mark, 10) == "Scheduler hit an exception\n"


@pytest.mark.parametrize(("body", "message"), [
    ('kind = "systemd"\nunit = "x.service"\nalgorithm = "DFLASH"\nlog_file = "/x"', 'only for kind = "external"'),
    ('kind = "container"\nalgorithm = "DFLASH"\nport = 30000\nrestart = "sometimes"', "on-failure[:N]"),
    ('kind = "container"\nalgorithm = "DFLASH"\nport = 30000\nlabel = "nolabel"', 'expected "key=value"'),
    ('kind = "container"\nalgorithm = "DFLASH"\nport = 30000\nengine = "lxc"', "docker, podman"),
])
def test_bad_keys_are_one_line_errors(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(InventoryError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_profile(_profile(tmp_path, body))


def test_container_gpus_all_and_inspect_states(tmp_path: Path) -> None:
    spec = load_profile(_profile(tmp_path, 'kind = "container"\nalgorithm = "DFLASH"\nport = 30000\ngpus = "all"\n'
                                           'image = "lmsysorg/sglang:latest"')).services["s"]
    assert spec.container is not None and spec.container.gpus == "all" and spec.container.engine == "docker"
    oom = state_from_inspect('{"Status": "exited", "ExitCode": 137, "OOMKilled": true}\t0\tid\trun\tn')
    assert oom.death is not None and oom.death.result == "oom-kill" and "OOMKilled=true" in oom.death.describe()
    loop = state_from_inspect('{"Status": "restarting", "Restarting": true, "ExitCode": 1}\t3\tid\trun\tn',
                              restart_policy="on-failure")
    assert loop.death is not None and "RestartCount=3" in loop.death.describe()
    assert state_from_inspect('{"Status": "running", "Running": true, "Pid": 7}\t0\tid\trun\tn').running is True
