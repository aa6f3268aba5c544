"""Logs are bytes, and a server's text is not the terminal's (issue 31, "Logs are bytes"). Real pytest runs of the
real suites against real refserver processes: a log that is not UTF-8 is read, not a crash; a log command that
prints 100 MB costs the run no memory; a server whose error body carries terminal escapes and a CI workflow
command reaches no output raw."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from e2e_helpers import SUITES
from services.http_doubles import FaultProxy, Reply, is_sampled
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control character but \t and \n


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")


@contextmanager
def latin1_writer(path: Path) -> Iterator[None]:
    """A server that logs Latin-1 while the run reads its log: a line with a lone \\xe9 every 50 ms."""
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            with path.open("ab") as handle:
                handle.write(b"[2026-01-01 00:00:00] caf\xe9 cr\xe8me served \xff\xfe\n")
            stop.wait(0.05)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def test_an_external_services_log_file_that_is_not_utf8_is_read_not_a_crash(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "server.log"
    log.write_bytes(b"caf\xe9 before the run\n")
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, latin1_writer(log):
        profile = tmp_path / "ext.toml"
        profile.write_text(f'[host]\nname = "ext"\nconnection = "local://"\n\n[services.dflash]\nkind = "external"\n'
                           f'url = "{server.url}"\nalgorithm = "DFLASH"\nlog_file = "{log}"\n')
        result = run_suite("service", "--host", str(profile))
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert verdict(run_suite.reports, "ext")["tests_verdict"] == "pass"


def test_an_attach_log_command_printing_bytes_that_are_not_utf8_is_read_not_a_crash(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
        result = run_suite("service", "--attach", server.url,
                           "--attach-log-command", r"printf 'caf\351 \377\376\n'; cat " + str(server.log_path))
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert verdict(run_suite.reports, host_name(server.url))["tests_verdict"] == "pass"


# The pytest run in a child of its own, so that RUSAGE_CHILDREN is the peak RSS of that run and its children
# alone (the log command's processes included), not of anything this test process ran before.
PEAK_RSS = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
print("peak-rss-kb", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""


def test_a_log_command_printing_100_mb_costs_the_run_no_memory(pytester: pytest.Pytester, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    reports = tmp_path / "reports"
    # 100 MB in lines, the last of which the diagnosis and the speculation check read
    command = "yes 'INFO a line the server repeats' | head -c 100000000; echo 'the last line'"
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
        started = time.monotonic()
        result = pytester.run(sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "pytest",
                              str(SUITES / "service"), "-p", "no:cacheprovider", f"--dflash-report={reports}",
                              "--attach", server.url, "--attach-log-command", command, timeout=120)
        took = time.monotonic() - started
    out = result.stdout.str()
    assert "INTERNALERROR" not in out + result.stderr.str()
    assert result.ret == 0, out[-3000:]
    peak_mb = int(re.findall(r"peak-rss-kb (\d+)", out)[-1]) / 1024
    # pytest, the plugin and its imports take ~100 MB; reading the 100 MB whole took 410 MB
    assert peak_mb < 200, f"peak RSS {peak_mb:.0f} MB: the log command's output was read whole"
    assert took < 60, f"{took:.0f}s"


HOSTILE = b"\x1b[2J\x1b]0;PWNED\x07 sampler crashed\r\n::error::injected\n  ::add-mask::x\n##vso[task.complete]"


def hostile_500(method: str, path: str, body: object) -> Reply | None:
    """Every sampled generation answered 500 with a body that would clear the screen, set the window title and
    issue CI workflow commands, were it printed raw."""
    return Reply(500, HOSTILE, content_type="text/plain") if is_sampled(path, body) else None


def test_a_servers_escapes_and_workflow_commands_reach_no_output_raw(run_suite, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "junit.xml"
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, FaultProxy(server.url, hostile_500) as proxy:
        # its log says the same kind of thing: the evidence section of the failure
        # (octal escapes: the command line itself, which the verdict records, holds none of it)
        log_command = r"printf '\033[2J\033]0;LOGPWNED\007\n\072:error::from-the-log\n\043#vso[task.complete]\n'"
        result = run_suite("smoke", "--attach", proxy.url, f"--junitxml={junit}", "--request-timeout=5s",
                           "--attach-log-command", log_command)
    assert_no_crash(result)
    assert result.ret == 1
    terminal = result.stdout.str() + "\n" + result.stderr.str()
    assert "PWNED" in terminal  # the server's words are there to read, written out
    assert "LOGPWNED" in terminal  # and its log's, in the evidence
    outputs = {"terminal": terminal, "junit": junit.read_text(), "step summary": summary.read_text()}
    outputs |= {path.name: path.read_text() for path in run_suite.reports.rglob("*") if path.is_file()
                and path.suffix in (".html", ".json", ".xml", ".prom", ".md", ".txt")}
    assert "fleet-summary.html" in outputs
    said = {name for name, text in outputs.items() if "PWNED" in text}
    assert {"terminal", "junit", "step summary", "fleet-summary.html", "fleet-junit.xml"} <= said, said
    for name, text in outputs.items():
        assert not RAW_CONTROL.search(text), f"{name}: {RAW_CONTROL.findall(text)}"
        assert not [line for line in text.splitlines() if line.lstrip().startswith("::")], name
        assert "##vso[" not in text, name
    data = verdict(run_suite.reports, host_name(proxy.url))
    assert data["verdict"] == "fail"
