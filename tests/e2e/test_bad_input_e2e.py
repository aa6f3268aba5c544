"""Bad input, end to end: a real `pytest suites/smoke` with the bad profile, URL, inventory or option, and the real
`pytest-dflash check` on the same input. Each is exit 4 and exactly one line naming the file (or option), the key
and what was expected, the same line from both; never a traceback, never INTERNALERROR, never a run that starts
(a `ready_timeout = 1e308` used to be accepted and wait forever)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_helpers import SUITES

SCRIPT = Path(sys.executable).parent / "pytest-dflash"
PASSWORD = "hunter2-Sw0rdfish"
EXTERNAL = """[host]
connection = "local://"
{host}
[services.a]
kind = "external"
algorithm = "DFLASH"
url = "{url}"
{service}
"""
SSH_BASE = """[host]
connection = "ssh://root@placeholder?timeout=3"

[services.dflash]
unit = "sglang-dflash.service"
algorithm = "DFLASH"
url = "http://{address}:30001"
"""


def profile(*, host: str = "", url: str = "http://127.0.0.1:9", service: str = "") -> str:
    return EXTERNAL.format(host=host, url=url, service=service)


# (id, files {name: text or bytes}, the pytest option and its value, what the one line says after "<file>: ")
CASES: list[tuple[str, dict[str, str | bytes], tuple[str, str], str]] = [
    ("not-utf8", {"h.toml": profile(host='name = "caf\xe9"').encode("latin-1")}, ("--host", "h.toml"),
     "h.toml: expected UTF-8 text, got byte 0xe9 at line 3"),
    ("ipv6-connection", {"h.toml": profile().replace("local://", "ssh://root@[fd00::1:22")}, ("--host", "h.toml"),
     "h.toml: host.connection: expected local:// or ssh://[user@]host[:port][?timeout=N], got "
     "'ssh://root@[fd00::1:22' (malformed host"),
    ("ipv6-url", {"h.toml": profile(url="http://[::1:30000")}, ("--host", "h.toml"),
     "h.toml: services.a.url: expected an http(s) URL, got 'http://[::1:30000' (malformed host"),
    ("ipv6-attach", {}, ("--attach", f"http://user:{PASSWORD}@[::1:30000"),
     "--attach: url: expected an http(s) URL, got 'http://user:***REDACTED***@[::1:30000' (malformed host"),
    ("name-slash", {"h.toml": profile(host='name = "rack1/gpu7"')}, ("--host", "h.toml"),
     "h.toml: host.name: expected a host name without '/' or '\\' (it is split on '/' in test ids: host/service), "
     "got 'rack1/gpu7'"),
    ("name-escape", {"h.toml": profile(host='name = "gpu7\\u001b[2J"')}, ("--host", "h.toml"),
     "h.toml: host.name: expected a host name without control or invisible characters, got 'gpu7\\x1b[2J'"),
    ("name-empty", {"h.toml": profile(host='name = ""')}, ("--host", "h.toml"),
     "h.toml: host.name: expected a host name that is not empty, got ''"),
    ("huge-duration", {"h.toml": profile(service="ready_timeout = 1e308")}, ("--host", "h.toml"),
     "h.toml: services.a.ready_timeout: expected a duration of at most 7 days (604800s, 168h), got 1e+308"),
    ("huge-duration-text", {"h.toml": profile(service='sampled_timeout = "99999999999999999999h"')},
     ("--host", "h.toml"), "h.toml: services.a.sampled_timeout: expected a duration of at most 7 days "
                           "(604800s, 168h), got '99999999999999999999h'"),
    ("nan-duration", {"h.toml": profile(service="ready_timeout = nan")}, ("--host", "h.toml"),
     "h.toml: services.a.ready_timeout: expected a duration like 90, '90s' or '15m', got nan"),
    ("fleet-name-slash", {"base.toml": SSH_BASE, "fleet.yml": "all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n"
                                                             "    'rack1/gpu7': {ansible_host: 10.0.0.7}\n"},
     ("--fleet", "fleet.yml"), "fleet.yml: hosts: expected a host name without '/'"),
    ("fleet-not-utf8", {"base.toml": SSH_BASE,
                        "fleet.yml": b"all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n    caf\xe9: {}\n"},
     ("--fleet", "fleet.yml"), "fleet.yml: expected UTF-8 text, got byte 0xe9 at line 4"),
    ("fleet-ipv6", {"base.toml": SSH_BASE, "fleet.yml": "all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n"
                                                       "    g1: {ansible_host: '[fd00::7'}\n"},
     ("--fleet", "fleet.yml"), "base.toml (host g1 of inventory fleet.yml): host.connection: expected local:// or ssh://[user@]host[:port]"
                               "[?timeout=N], got 'ssh://[fd00::7?timeout=3' (malformed host"),
]


def _one_error_line(text: str, prefix: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), text
    return lines[0].removeprefix(prefix)


def _check(cwd: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "pytest_dflash.cli"]
    return subprocess.run([*command, "check", *targets], capture_output=True, text=True, timeout=60, cwd=cwd,
                          check=False)


@pytest.fixture
def run_pytest(pytester: pytest.Pytester) -> Callable[..., pytest.RunResult]:
    def run(*args: str) -> pytest.RunResult:
        # A bad value must stop the run before it starts: 60 s is far more than a usage error takes (the old
        # code accepted ready_timeout = 1e308 and waited on a closed port "forever").
        return pytester.runpytest_subprocess(str(SUITES / "smoke"), "-p", "no:cacheprovider", *args, timeout=60)

    return run


@pytest.mark.parametrize(("files", "option", "expected"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_4_from_pytest_and_from_check(
        pytester: pytest.Pytester, run_pytest: Callable[..., pytest.RunResult], files: dict[str, str | bytes],
        option: tuple[str, str], expected: str) -> None:
    for name, content in files.items():
        path = pytester.path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    flag, value = option
    result = run_pytest(flag, value)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 4, output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
    line = _one_error_line(result.stderr.str(), "ERROR: ")
    where = line if flag == "--attach" else line.removeprefix(f"{pytester.path}/")
    assert where.startswith(expected), line
    assert PASSWORD not in output

    done = _check(pytester.path, value)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert _one_error_line(done.stderr, "pytest-dflash check: error: ") == line  # the same line as pytest's
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.parametrize(("args", "expected"), [
    (["--ready-timeout", "99999999999999999999h"],
     "--ready-timeout / dflash_ready_timeout: '99999999999999999999h' is longer than the maximum, 7 days"),
    (["--request-timeout", "169h"], "--request-timeout / dflash_request_timeout: '169h' is longer than the maximum"),
    (["--parity-tie-gap", "nan"], "--parity-tie-gap / dflash_parity_tie_gap: 'nan' is not a finite number"),
])
def test_a_bad_duration_or_number_option_is_one_line_and_exit_4(run_pytest: Callable[..., pytest.RunResult],
                                                                args: list[str], expected: str) -> None:
    result = run_pytest("--host", "local", *args)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 4, output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output
    assert _one_error_line(result.stderr.str(), "ERROR: ").startswith(expected), result.stderr.str()


@pytest.mark.parametrize(("option", "where"), [
    ("--html", "--html"),  # pytest-html's own INTERNALERROR at the end of the run, before
    ("--junitxml", "--junitxml"),  # pytest's traceback at the end of the run, before
    ("--dflash-probe-dump", "--dflash-probe-dump / dflash_probe_dump"),  # the host's env check failed, before
    ("--dflash-history", "--dflash-history / dflash_history"),  # a pass with no history written, before
    ("--prometheus", "--prometheus / dflash_prometheus"),
])
def test_an_output_path_that_cannot_be_written_is_one_line_before_the_run(
        pytester: pytest.Pytester, run_pytest: Callable[..., pytest.RunResult], option: str, where: str) -> None:
    (pytester.path / "plainfile").write_text("a file, not a folder\n")
    target = pytester.path / "plainfile" / "out"  # its 'folder' is a file: nothing can be created under it
    result = run_pytest("--host", "local", f"{option}={target}", f"--dflash-report={pytester.path / 'r'}")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 4, output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
    line = _one_error_line(result.stderr.str(), "ERROR: ")
    problem = f"{pytester.path / 'plainfile'} is a file, not a folder"
    assert line == f"{where} {target}: cannot write there: {problem}", line
    assert "started" not in output  # no server was started for a run that could not report
