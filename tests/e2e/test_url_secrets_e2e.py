"""Passwords in URLs never reach a line the plugin prints or a file it writes: the `dflash: run …; hosts:` report
header, the progress line of an attached server that is not up yet, and every file of a run (verdict, fleet
summary JSON / HTML, JUnit, pytest-html, the GitHub step summary). Real pytest subprocesses; the URLs carry
their passwords all the way to ssh and HTTP, only what is shown is masked."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import SUITES
from support.pytest_runs import assert_no_crash, verdict

PASSWORD = "Tr0ub4dor-and-3"
MASK = "***REDACTED***"
# ssh to a port nothing listens on: the host layer fails at once (refused), so the whole run takes a second.
SSH_PROFILE = f"""[host]
connection = "ssh://root:{PASSWORD}@127.0.0.1:1"

[services.dflash]
unit = "sglang-dflash.service"
algorithm = "DFLASH"
port = 30001
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_report_header_masks_the_connections_password(pytester: pytest.Pytester, tmp_path: Path) -> None:
    (tmp_path / "gpu7.toml").write_text(SSH_PROFILE)
    result = pytester.runpytest_subprocess(str(SUITES / "smoke"), "-p", "no:cacheprovider", "--collect-only",
                                           "--host", str(tmp_path / "gpu7.toml"))
    assert_no_crash(result)
    output = result.stdout.str() + result.stderr.str()
    assert PASSWORD not in output
    result.stdout.fnmatch_lines([f"dflash: run *; hosts: gpu7 (ssh://root:{MASK}@127.0.0.1:1?timeout=4; 1 service; "
                                 "attach)"])


def test_no_file_or_line_of_a_run_holds_the_password(pytester: pytest.Pytester, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpu7.toml").write_text(SSH_PROFILE)
    reports = tmp_path / "reports"
    step_summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    monkeypatch.setenv("DFLASH_STATE_DIR", str(tmp_path / "state"))
    result = pytester.runpytest_subprocess(
        str(SUITES / "smoke"), "-p", "no:cacheprovider", "--host", str(tmp_path / "gpu7.toml"),
        f"--dflash-report={reports}", f"--html={reports / 'report.html'}", f"--junitxml={reports / 'junit.xml'}",
        "-rA", timeout=120)
    assert_no_crash(result)
    assert result.ret == 1  # the host layer failed: nothing listens on port 1
    assert PASSWORD not in result.stdout.str() + result.stderr.str()
    written = [p for p in reports.rglob("*") if p.is_file()] + [step_summary]
    assert {p.name for p in written} >= {"gpu7.verdict.json", "fleet-summary.json", "fleet-summary.html",
                                         "fleet-junit.xml", "junit.xml", "report.html", "step-summary.md"}
    for path in written:
        assert PASSWORD not in path.read_text(errors="replace"), path
    assert verdict(reports, "gpu7")["connection"] == f"ssh://root:{MASK}@127.0.0.1:1?timeout=4"


def test_the_progress_line_of_an_attached_server_not_up_yet_masks_the_password(tmp_path: Path) -> None:
    """Nothing listens at the URL: discovery says every 10 s that it is still waiting for /server_info, naming
    the URL. The run is stopped once that line is out (the wait itself is bounded elsewhere)."""
    url = f"http://user:{PASSWORD}@127.0.0.1:{_free_port()}"
    env = {**os.environ, "DFLASH_STATE_DIR": str(tmp_path / "state")}
    env.pop("GITHUB_STEP_SUMMARY", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(SUITES / "smoke"), "-p", "no:cacheprovider", "--attach", url,
         f"--dflash-report={tmp_path / 'reports'}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        for line in process.stderr:  # discovery writes its progress line to stderr, before the session starts
            lines.append(line)
            if "to answer /server_info" in line or time.monotonic() > deadline:
                break
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    text = "".join(lines) + err + out
    waiting = [line for line in lines if "to answer /server_info" in line]
    assert waiting, text[-3000:]
    assert f"http://user:{MASK}@127.0.0.1:" in waiting[0]
    assert PASSWORD not in text


TOKEN = "sk-abc123secret"  # too short for the sk- key shape: only its place in the URL says it is a secret


def test_a_token_as_an_attached_urls_user_reaches_no_line_or_file(pytester: pytest.Pytester, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`http://TOKEN@host:port` (a token as the URL's user, no password) and `?key=TOKEN`: a real run of the smoke
    suite whose server dies on its first sampled request (a failure, with its evidence), and no line it prints
    nor file it writes holds the token."""
    from pytest_dflash.refserver.launch import RefServerProcess

    reports = tmp_path / "reports"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("DFLASH_STATE_DIR", str(tmp_path / "state"))
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "flashinfer-sm120") as server:
        port = server.url.rsplit(":", 1)[1]
        (tmp_path / "tok.toml").write_text(
            f'[host]\nconnection = "local://"\n\n[services.remote]\nkind = "external"\n'
            f'url = "http://{TOKEN}@127.0.0.1:{port}"\n'
            f'[services.other]\nkind = "external"\nalgorithm = "DFLASH"\n'
            f'url = "http://127.0.0.1:{_free_port()}/?key={TOKEN}x"\nready_timeout = "1s"\n')
        result = pytester.runpytest_subprocess(
            str(SUITES / "smoke"), "-p", "no:cacheprovider", "--host", str(tmp_path / "tok.toml"),
            f"--dflash-report={reports}", f"--html={reports / 'report.html'}",
            f"--junitxml={reports / 'junit.xml'}", "-rA", "--request-timeout=20s", timeout=300)
    assert_no_crash(result)
    assert result.ret == 1  # the server died: the run failed, with evidence
    output = result.stdout.str() + result.stderr.str()
    assert TOKEN not in output
    assert f"http://{MASK}@127.0.0.1:{port}" in output
    written = [p for p in reports.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"tok.verdict.json", "junit.xml", "report.html"}
    for path in written:
        assert TOKEN not in path.read_text(errors="replace"), path
