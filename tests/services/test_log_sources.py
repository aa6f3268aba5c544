"""External services' log sources (log_command / log_file) and the container keys, read for real on this machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.errors import InventoryError
from pytest_dflash.hostaccess.transport import Transport
from pytest_dflash.scrub.bounds import LOG_READ_BYTES
from pytest_dflash.services.base import LogMark
from pytest_dflash.services.container import state_from_inspect
from pytest_dflash.services.external import ExternalService
from pytest_dflash.services.process import ProcessService


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
    deep = state_from_inspect("[" * 20_000 + "\t0\tid\trun\tn")  # a RecursionError before
    assert deep.death is not None and "unreadable inspect output" in deep.death.describe()


# ---- logs are bytes: any byte decodes, and a read is a bounded tail -------------------------------------------

def test_a_log_command_printing_bytes_that_are_not_utf8_reads_with_replacement(tmp_path: Path) -> None:
    profile = load_profile(_profile(tmp_path, 'kind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n'
                                              "log_command = \"printf 'ok\\\\377\\\\376 caf\\\\351\\\\n'\""))
    service = ExternalService(profile.services["s"], Transport(profile, read_only=True))
    assert service.logs_since(LogMark(0.5), 10) == "ok\ufffd\ufffd caf\ufffd\n"


def test_a_log_file_with_a_latin1_line_reads_from_the_offset_with_replacement(tmp_path: Path) -> None:
    logfile = tmp_path / "server.log"
    logfile.write_bytes(b"before\n")
    profile = load_profile(_profile(tmp_path, f'kind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n'
                                              f'log_file = "{logfile}"'))
    service = ExternalService(profile.services["s"], Transport(profile, read_only=True))
    mark = service.log_mark()
    with logfile.open("ab") as handle:
        handle.write(b"caf\xe9 served\n")
    assert service.logs_since(mark, 10) == "caf\ufffd served\n"


def test_a_log_command_that_prints_megabytes_is_read_as_its_bounded_tail(tmp_path: Path) -> None:
    profile = load_profile(_profile(tmp_path, 'kind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n'
                                              'log_command = "true"'))
    transport = Transport(profile, read_only=True)
    # 24 MB in one line, then the lines that matter: the line is cut on the host, never read whole here
    result = transport.read_tail("head -c 24000000 /dev/zero | tr '\\0' x; echo; seq 1 5; exit 3",
                                 limit=64 * 1024)
    assert result.rc == 3  # the command's own status, past the pipe
    assert len(result.stdout.encode()) <= 64 * 1024
    assert result.stdout.startswith("[… earlier output not read: cap 64 KB per log read]\n")
    assert result.stdout.splitlines()[-5:] == ["1", "2", "3", "4", "5"]
    assert "xxx" not in result.stdout  # the part of a line the cut began in is left out
    small = transport.read_tail("echo one; echo two >&2")
    assert (small.rc, small.stdout) == (0, "one\ntwo\n")


def test_a_log_file_bigger_than_the_read_cap_is_read_from_its_end(tmp_path: Path) -> None:
    logfile = tmp_path / "server.log"
    logfile.write_bytes(b"old line\n" * 10)
    profile = load_profile(_profile(tmp_path, f'kind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n'
                                              f'log_file = "{logfile}"'))
    service = ExternalService(profile.services["s"], Transport(profile, read_only=True))
    mark = service.log_mark()
    with logfile.open("ab") as handle:
        handle.write(b"y" * (LOG_READ_BYTES + 4096) + b"\nlast line\n")
    log = service.logs_since(mark, 10)
    assert log.endswith("last line\n") and "yyy" not in log and "old line" not in log


def test_a_process_log_is_read_from_the_mark_as_a_bounded_tail_with_replacement(tmp_path: Path) -> None:
    spec = ServiceSpec(name="svc", kind="process", url="http://127.0.0.1:{port}", algorithm="DFLASH",
                       command=("true",))
    service = ProcessService(spec, host="h", run_id="bytes", python=sys.executable, log_dir=tmp_path)
    service.log_path.write_bytes(b"before the mark\n")
    mark = service.log_mark()
    with service.log_path.open("ab") as handle:
        handle.write(b"caf\xe9 \xff\xfe\n")
    assert service.logs_since(mark, 10) == "caf\ufffd \ufffd\ufffd"
    with service.log_path.open("ab") as handle:
        handle.write(b"y" * (LOG_READ_BYTES + 4096) + b"\nthe last line\n")
    assert service.logs_since(mark, 10) == "the last line"  # the line the read cap cut into is left out


def test_a_log_source_that_fails_says_so_with_its_exit_status(tmp_path: Path) -> None:
    missing = tmp_path / "gone.log"
    profile = load_profile(_profile(tmp_path, f'kind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n'
                                              f'log_file = "{missing}"'))
    log = ExternalService(profile.services["s"], Transport(profile, read_only=True)).logs_since(LogMark(0.5, 0), 10)
    assert log.startswith(f"(could not read the log (log_file {missing}): exit 1: stat: "), log
    assert "No such file" in log
