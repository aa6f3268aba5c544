"""Structured output through the real plugin: `suites/generation -k structured` against refserver processes.

A clean NONE and DFLASH pass; a server with `--grammar-backend none` fails every case naming the flag and
seed 002; once its profile says `structured_output = false` its clean refusal (HTTP 400) passes, while a
server so declared that accepts a grammar and ignores it, or answers 500, fails; the grammar-rollback-bug
fault fails under speculation only. Under --reasoning-parser the chat's answer after the
reasoning validates against the schema; the reasoning-grammar-bug fault (the answer in reasoning_content) fails.
"""

from __future__ import annotations

import json
from pathlib import Path

from e2e_helpers import toml_list, write_profile
from services.http_doubles import GRAMMAR_FIELDS, FaultProxy, Reply, grammar_500, grammar_ignored
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

NO_WS = ["--constrained-json-disable-any-whitespace"]
# one greedy and one sampled case per API: enough to see each behaviour, cheap on two cores
CASES = "structured and (generate-json_schema or chat-json_object or generate-regex) and whole"


def test_grammar_backend_none_fails_naming_the_flag_unless_the_profile_says_so(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "nogrammar",
                            {"off": ("DFLASH", ["--grammar-backend", "none"]),
                             "declared": ("NONE", ["--grammar-backend", "none"])},
                            service_extra={"declared": "structured_output = false"})  # fmt: skip
    result = run_suite("generation", "--host", str(profile), "-k", CASES)
    assert_no_crash(result)
    result.assert_outcomes(failed=6, passed=6)  # declared: refused with SGLang's 400, as it should be
    result.stdout.fnmatch_lines(["*off: its command has `--grammar-backend none`: every constrained request*"
                                 "seed 002*structured_output = false*"])
    failed = {f["test"].rsplit("::", 1)[1] for f in verdict(run_suite.reports, "nogrammar")["failures"]}
    assert all("nogrammar/off-" in test for test in failed), failed


def test_a_server_declared_without_structured_output_must_refuse_not_ignore_the_grammar(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """structured_output = false: a 200 whose output ignores the grammar (the client asked for JSON and silently got
    text) fails, naming the grammar; so does a 500; the same server behind no fault refuses with 400 and passes."""
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--grammar-backend", "none") as server, \
            FaultProxy(server.url, grammar_ignored(server.url)) as ignoring, \
            FaultProxy(server.url, grammar_500) as crashing:
        profile = tmp_path / "declared.toml"
        profile.write_text('[host]\nname = "declared"\nconnection = "local://"\n' + "".join(
            f'[services.{name}]\nkind = "external"\nurl = "{url}"\nalgorithm = "DFLASH"\n'
            "structured_output = false\n"
            for name, url in (("ignores", ignoring.url), ("crashes", crashing.url), ("refuses", server.url))))
        result = run_suite("generation", "--host", str(profile), "-k", CASES)
    assert_no_crash(result)
    failed = {f["test"].rsplit("::", 1)[1].split("[", 1)[1].split("-", 1)[0]
              for f in verdict(run_suite.reports, "declared")["failures"]}
    assert failed == {"declared/ignores", "declared/crashes"}, failed
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 6 and outcomes.get("failed") == 12, outcomes  # refuses: every case passes
    result.stdout.fnmatch_lines(["*ignores: json_schema * via generate (greedy): accepted and answered *, which "
                                 "*not even a prefix of the grammar's language*silently gets unconstrained output; "
                                 "its profile says structured_output = false*",
                                 "*crashes: * its profile says structured_output = false, so a constrained request "
                                 "must be refused (HTTP 400), got * HTTP 500*"])


def test_rollback_bug_fails_under_speculation_and_passes_as_none(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bug = ["--inject", "grammar-rollback-bug", *NO_WS]
    profile = write_profile(tmp_path, "rollback", {"none": ("NONE", bug), "dflash": ("DFLASH", bug)})
    result = run_suite("generation", "--host", str(profile), "-k", CASES)
    assert_no_crash(result)
    failed = {f["test"].rsplit("::", 1)[1] for f in verdict(run_suite.reports, "rollback")["failures"]}
    assert failed and all("rollback/dflash" in test for test in failed), failed
    assert result.parseoutcomes().get("passed", 0) >= 6  # every NONE case
    result.stdout.fnmatch_lines(["*AssertionError: dflash: *finish_reason 'abort' (Grammar accept_token failed*",
                                 "*FAILED*rollback/dflash*[[]grammar-accept-failed[]]*"])


def test_rollback_bug_fails_structured_parity_naming_the_token_and_the_grammar(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "gparity", {"none": ("NONE", NO_WS),
                                                  "dflash": ("DFLASH", ["--inject", "grammar-rollback-bug", *NO_WS])},
                            parity=("none", ["dflash"]))  # fmt: skip
    result = run_suite("parity", "--host", str(profile), "-k", "structured_parity")
    assert_no_crash(result)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gparity/none vs gparity/dflash under grammars: */9 (grammar, prompt) pairs "
                                 "token-identical*",
                                 "*json_schema '{*: *diverges at token * (real*"])


def test_forced_tool_calls_and_reasoning_where_the_command_names_a_parser(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Forced calls, whole and streamed, pass on a healthy DFLASH server; `--grammar-backend none` fails both
    forms, naming the flag. (The grammar-rollback-bug fault leaves these calls valid: see
    test_forced_calls_stay_valid_under_the_rollback_bug.)"""
    parsers = ["--tool-call-parser", "qwen25", "--reasoning-parser", "deepseek-r1", *NO_WS]
    profile = write_profile(tmp_path, "chat", {"parsers": ("DFLASH", parsers), "plain": ("NONE", NO_WS),
                                               "off": ("NONE", ["--tool-call-parser", "qwen25",
                                                                "--grammar-backend", "none"])})  # fmt: skip
    result = run_suite("generation", "--host", str(profile), "-k", "forced_tool_call or reasoning_separated")
    assert_no_crash(result)
    result.assert_outcomes(passed=9, skipped=10, failed=8)  # plain: no parser; off: no reasoning parser
    failed = {f["test"].rsplit("::", 1)[1] for f in verdict(run_suite.reports, "chat")["failures"]}
    assert failed == {f"test_forced_tool_call[chat/off-{c}-{s}-{form}]" for c in ("required", "named")
                      for s in ("greedy", "sampled") for form in ("whole", "sse")}, failed  # fmt: skip
    result.stdout.fnmatch_lines(["*off: its command has `--grammar-backend none`: tool_choice * cannot be forced*"])


def test_forced_calls_stay_valid_under_the_rollback_bug(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A known blind spot, pinned so that a change to it is seen: the missed rollback leaves an extra token in
    the matcher, which shows only where it crosses a bound of the grammar (an abort); the forced call's
    `add(a, b)` has unbounded integers, so its output stays valid, whole and streamed, and only
    test_structured_output / test_structured_parity see the fault."""
    bug = ["--tool-call-parser", "qwen25", "--inject", "grammar-rollback-bug", *NO_WS]
    profile = write_profile(tmp_path, "rollcall", {"bug": ("DFLASH", bug)})
    result = run_suite("generation", "--host", str(profile), "-k", "forced_tool_call")
    assert_no_crash(result)
    result.assert_outcomes(passed=8)


def test_the_answer_after_the_reasoning_validates_and_an_answer_in_reasoning_content_fails(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reasoner = ["--reasoning-parser", "deepseek-r1", *NO_WS]
    profile = write_profile(tmp_path, "reasoned", {"thinks": ("DFLASH", reasoner), "plain": ("NONE", NO_WS),
                                                   "bug": ("NONE", [*reasoner, "--inject", "reasoning-grammar-bug"])})  # fmt: skip
    result = run_suite("generation", "--host", str(profile), "-k", "reasoning_structured")
    assert_no_crash(result)
    result.assert_outcomes(passed=2, skipped=2, failed=2)  # plain: no --reasoning-parser
    failed = {f["test"].rsplit("::", 1)[1] for f in verdict(run_suite.reports, "reasoned")["failures"]}
    assert failed == {f"test_reasoning_structured[reasoned/bug-{s}]" for s in ("whole", "sse")}, failed
    result.stdout.fnmatch_lines(["*bug: response_format json_schema '{*' after reasoning (--reasoning-parser "
                                 "deepseek-r1)*: content '' not JSON*the answer is in reasoning_content*"])


def _error_in_a_200(method: str, path: str, body: object) -> Reply | None:
    """A server that answers every chat request 200 with an error object instead of choices (a gateway that
    wraps an engine's failure in a 200)."""
    if method != "POST" or path != "/v1/chat/completions":
        return None
    return Reply(200, json.dumps({"object": "error", "message": "engine overloaded", "code": 503}).encode())


def test_a_200_without_choices_fails_the_chat_surface_checks_in_one_line(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every chat answer is a 200 carrying an error object: reasoning separation (which once found "no
    reasoning, no content" equal to an empty output split in two, and passed) and the forced tool call fail,
    each with an ApiError naming the missing choices, no AttributeError."""
    parsers = ["--reasoning-parser", "deepseek-r1", "--tool-call-parser", "qwen25"]
    with RefServerProcess("--speculative-algorithm", "DFLASH", *parsers, *NO_WS) as server, \
            FaultProxy(server.url, _error_in_a_200) as proxy:
        profile = tmp_path / "wrapped.toml"
        profile.write_text(f'[host]\nname = "wrapped"\nconnection = "local://"\n[services.dflash]\n'
                           f'kind = "external"\nurl = "{proxy.url}"\nalgorithm = "DFLASH"\n'
                           f"command = {toml_list(['python', '-m', 'sglang.launch_server', *parsers])}\n")
        result = run_suite("generation", "--host", str(profile), "-k",
                           "reasoning_separated or (forced_tool_call and whole) or chat-json_object and whole "
                           "and greedy")
    assert_no_crash(result)
    result.assert_outcomes(failed=6)  # 4 forced calls (required / named, greedy / sampled), 2 more
    result.stdout.fnmatch_lines(["*ApiError: wrapped/dflash /v1/chat/completions: HTTP 200: response has no "
                                 "choices*"])
    result.stdout.no_fnmatch_line("*AttributeError*")


def _throttled(method: str, path: str, body: object) -> Reply | None:
    """A gateway in front that answers every constrained request 429 (rate limited): no refusal of the grammar."""
    if method != "POST" or not isinstance(body, dict) or not any(
            key in body or key in (body.get("sampling_params") or {}) for key in GRAMMAR_FIELDS):
        return None
    return Reply(429, json.dumps({"error": {"message": "rate limited", "code": 429}}).encode())


def test_a_429_is_no_refusal_of_the_grammar(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """structured_output = false asks a server to refuse a constrained request (400, as SGLang); a 429 (or a
    401, a 404) once passed as that refusal, though it says nothing about the grammar."""
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--grammar-backend", "none") as server, \
            FaultProxy(server.url, _throttled) as proxy:
        profile = tmp_path / "throttled.toml"
        profile.write_text('[host]\nname = "throttled"\nconnection = "local://"\n[services.dflash]\n'
                           f'kind = "external"\nurl = "{proxy.url}"\nalgorithm = "DFLASH"\n'
                           "structured_output = false\n")
        result = run_suite("generation", "--host", str(profile), "-k", "structured and generate-regex and whole")
    assert_no_crash(result)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*HTTP 429 is no refusal of the request (that is 400 or 422); it says nothing "
                                 "about the grammar*"])
