"""Issue 39's fourth trust pass, tried again as a hostile reviewer would: shapes the first fixes left open, each
against real refserver processes through the real suites."""

from __future__ import annotations

from pathlib import Path

from e2e_helpers import write_profile
from support.pytest_runs import assert_no_crash, verdict

TOOLS = ["--tool-call-parser", "qwen25", "--constrained-json-disable-any-whitespace"]


def test_the_deploy_gate_sees_tool_calls_forced_only_for_greedy_requests(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Before: smoke's one forced call was greedy, so a server that forces calls only for greedy requests (most
    clients sample) passed `smoke --gate service,generation`, exit 0; only suites/generation saw it. Smoke's call
    is now sampled: it fails that service, and the healthy one beside it passes."""
    profile = write_profile(tmp_path, "greedyonly", {"greedyonly": ("NONE", [*TOOLS, "--inject", "tools-greedy-only"]),
                                                     "tools": ("NONE", TOOLS)})
    result = run_suite("smoke", "--host", str(profile), "--gate", "service,generation", "-rA")
    assert_no_crash(result)
    data = verdict(run_suite.reports, "greedyonly")
    assert [f["test"].rsplit("::", 1)[1] for f in data["failures"]] == [
        "test_forced_tool_call[greedyonly/greedyonly]"], data["failures"]
    result.stdout.fnmatch_lines(["PASSED *test_forced_tool_call[[]greedyonly/tools[]]*"], consecutive=False)
    result.stdout.fnmatch_lines(["*greedyonly: tool_choice \"required\" (--tool-call-parser qwen) sampled*"])
    result.stdout.fnmatch_lines(["gate service,generation: FAILED*"])
    assert result.ret != 0



def test_an_abort_that_is_no_refusal_fails_a_service_that_serves_no_structured_output(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """structured_output = false: SGLang's streamed /generate refusal (an abort with status_code 400) passes; a
    grammar that breaks under speculation (the matcher refuses a token: an abort with status 500) passed as a
    refusal too before, and now fails, naming the status."""
    declared = "structured_output = false"
    profile = write_profile(tmp_path, "undeclared", {"off": ("NONE", ["--grammar-backend", "none"]),
                                                     "broken": ("DFLASH", ["--inject", "grammar-rollback-bug",
                                                                          "--constrained-json-disable-any-whitespace"])},
                            service_extra={"off": declared, "broken": declared})
    result = run_suite("generation", "--host", str(profile), "-k", "structured and generate-", "-rA")
    assert_no_crash(result)
    failed = {f["test"].rsplit("::", 1)[1] for f in verdict(run_suite.reports, "undeclared")["failures"]}
    assert failed and all("undeclared/broken" in name for name in failed), failed
    result.stdout.fnmatch_lines(["*broken: *an abort with status 500*no refusal of the request*"])
    result.stdout.fnmatch_lines(["PASSED *test_structured_output[[]undeclared/off-generate-json_schema-greedy-sse[]]*"],
                                consecutive=False)

