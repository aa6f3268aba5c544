"""Attached servers are judged on what they say they serve (issue 39, item 5; issue 41, item 3): the parsers,
grammar backend and parallel sizes come from /server_info without a command, and a command that contradicts
/server_info fails the service layer, naming both. Real pytest runs against real refserver processes."""

from __future__ import annotations

from pathlib import Path

from e2e_helpers import toml_list
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

NO_WS = ["--constrained-json-disable-any-whitespace"]
PARSERS = ["--tool-call-parser", "qwen25", "--reasoning-parser", "deepseek-r1"]


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")


def _profile(tmp_path: Path, url: str, command: list[str]) -> Path:
    """An external service (started elsewhere) whose profile says the command it was started with."""
    path = tmp_path / "said.toml"
    path.write_text(f'[host]\nname = "said"\nconnection = "local://"\n[services.dflash]\nkind = "external"\n'
                    f'url = "{url}"\nalgorithm = "DFLASH"\n'
                    f"command = {toml_list(['python', '-m', 'sglang.launch_server', *command])}\n")
    return path


def test_an_attached_server_gets_the_parser_its_server_info_reports_checked(run_suite) -> None:  # type: ignore[no-untyped-def]
    """--attach URL, no command: /server_info says tool_call_parser qwen (SGLang renames qwen25) and reasoning_parser deepseek-r1, so the
    forced tool calls and the reasoning split run and pass (they skipped: "the service's command sets no
    --tool-call-parser"); the served settings are the verdict's fact."""
    with RefServerProcess("--speculative-algorithm", "DFLASH", *PARSERS, *NO_WS) as server:
        result = run_suite("generation", "--attach", server.url, "-k", "forced_tool_call or reasoning_separated")
    assert_no_crash(result)
    result.assert_outcomes(passed=9)  # 8 forced calls (required / named, greedy / sampled, whole / streamed), the split
    served = verdict(run_suite.reports, host_name(server.url))["services"]["attached"]["served"]
    assert served == {"tool_call_parser": "qwen", "reasoning_parser": "deepseek-r1", "grammar_backend": "xgrammar",
                      "tp_size": 1, "dp_size": 1, "pp_size": 1, "ep_size": 1}, served


def test_an_attached_server_without_a_parser_does_not_apply_saying_what_it_serves(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "NONE") as server:
        result = run_suite(["generation", "service"], "--attach", server.url, "-rs", "-k",
                           "forced_tool_call or reasoning_separated or commands_configuration")
    assert_no_crash(result)
    result.assert_outcomes(skipped=10)  # 8 forced calls, the reasoning split, the comparison (no command)
    result.stdout.fnmatch_lines(["*its profile has no command to compare: what it serves is read from /server_info "
                                 "(no --tool-call-parser (/server_info); *; --tp-size 1 (/server_info)*",
                                 "*the service serves no --tool-call-parser (its command sets none; /server_info "
                                 "says none)*"])
    assert result.ret == 0, result.stdout.str()[-3000:]


def test_a_command_that_contradicts_server_info_fails_the_service_layer(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The profile's command says --tp-size 2 and --tool-call-parser qwen25; the server's /server_info says tp_size 1
    and no parser (issue 41: "When /server_info says tp_size 1 but the command says --tp-size 2"): the service layer
    fails naming both, and the forced tool calls are not passed or skipped as "does not apply"."""
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
        profile = _profile(tmp_path, server.url, ["--tp-size", "2", "--tool-call-parser", "qwen25"])
        result = run_suite("smoke", "--host", str(profile), "-k", "commands_configuration")
        failure = verdict(run_suite.reports, "said")["failures"][0]
        alone = run_suite("generation", "--host", str(profile), "-rs", "-k", "forced_tool_call and whole")
    for run in (result, alone):
        assert_no_crash(run)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*FAILED*test_serves_the_commands_configuration[[]said/dflash[]]*"])
    assert "said/dflash does not serve what its command sets: its command sets --tool-call-parser qwen25, " \
           "/server_info says tool_call_parser = None; its command sets --tp-size 2, /server_info says " \
           "tp_size = 1" in str(failure), failure
    # generation run alone: the forced calls could not be checked (never "does not apply")
    alone.assert_outcomes(skipped=4)  # required / named, greedy / sampled
    alone.stdout.fnmatch_lines(["*could not check: said/dflash: its command sets --tool-call-parser qwen25, "
                                "/server_info says tool_call_parser = None*"])


def test_a_command_that_agrees_with_server_info_passes(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--tool-call-parser", "qwen25", *NO_WS) as server:
        profile = _profile(tmp_path, server.url, ["--tp-size", "1", "--tool-call-parser", "qwen25", "--grammar-backend",
                                                  "xgrammar", *NO_WS])
        result = run_suite(["service", "generation"], "--host", str(profile), "-k",
                           "commands_configuration or (forced_tool_call and whole)")
    assert_no_crash(result)
    result.assert_outcomes(passed=5)  # the comparison, 4 whole forced calls
