"""--attach-log-command: an attached server's log, read by a command the user names (docker logs, kubectl logs,
journalctl), is the evidence and the diagnosis's input exactly like a journal (issue 13 item 2). Real pytest runs
against a real refserver that dies on its first sampled request."""

from __future__ import annotations

from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess


def test_the_log_command_feeds_the_evidence_and_the_diagnosis(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "flashinfer-sm120") as server:
        command = f"tail -n {{lines}} {server.log_path}"
        result = run_suite("smoke", "--attach", server.url, "--attach-log-command", command)
    assert_no_crash(result)
    assert result.ret == 1
    out = result.stdout.str()
    assert "Scheduler hit an exception" in out  # the server's own log, through the command
    host = server.url.removeprefix("http://").replace(":", "_")
    failure = verdict(run_suite.reports, host)["failures"][0]
    assert "flashinfer-sm12x-nvcc" in {d["id"] for d in failure["diagnosis"]}, failure


def test_without_a_log_command_the_evidence_says_how_to_get_one(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", "flashinfer-sm120") as server:
        result = run_suite("smoke", "--attach", server.url)
    assert_no_crash(result)
    assert result.ret == 1
    assert "--attach-log-command" in result.stdout.str()
