"""No check of the generation layer passes on evidence it did not get (issue 39), through the real plugin and
suites against refserver processes and small stdlib proxies as the bad peers: a forced call never made, forced
only for greedy requests, cut by max_tokens; a cut constrained output with no grammar matcher on the
controller; a reasoning model's chat; a streamed refusal as SGLang's serving_chat sends it; the deploy gate
(smoke) on a server launched with --grammar-backend none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_helpers import write_profile
from services.http_doubles import GRAMMAR_FIELDS, FaultProxy, Reply, Rule
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

NO_WS = ["--constrained-json-disable-any-whitespace"]
TOOLS = ["--tool-call-parser", "qwen25", *NO_WS]


def failed_tests(run_suite: Any, host: str) -> set[str]:
    return {f["test"].rsplit("::", 1)[1] for f in verdict(run_suite.reports, host)["failures"]}


def test_a_server_that_ignores_tools_fails_every_forced_call(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """tools and tool_choice dropped, the output rambles to max_tokens (finish length): all four forced-call
    cases passed with a GrammarWarning before; now each fails, saying no call was made."""
    profile = write_profile(tmp_path, "notools", {"dflash": ("DFLASH", [*TOOLS, "--inject", "ignore-tools"])})
    result = run_suite("generation", "--host", str(profile), "-k", "forced_tool_call")
    assert_no_crash(result)
    result.assert_outcomes(failed=8)
    result.stdout.fnmatch_lines(["*dflash: tool_choice * (--tool-call-parser qwen)*: no tool call at all: the "
                                 "output ran to max_tokens=200 (finish_reason 'length') as content *: the forced "
                                 "call was never made*"])
    assert "GrammarWarning" not in result.stdout.str()
    assert verdict(run_suite.reports, "notools")["layers"]["generation"]["outcome"] == "failed"


def test_a_server_that_forces_calls_only_for_greedy_requests_fails_the_sampled_ones(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(tmp_path, "greedyonly",
                            {"dflash": ("DFLASH", [*TOOLS, "--inject", "tools-greedy-only"])})
    result = run_suite("generation", "--host", str(profile), "-k", "forced_tool_call")
    assert_no_crash(result)
    result.assert_outcomes(passed=4, failed=4)
    assert failed_tests(run_suite, "greedyonly") == {
        f"test_forced_tool_call[greedyonly/dflash-{choice}-sampled-{form}]" for choice in ("required", "named")
        for form in ("whole", "sse")}  # fmt: skip


def test_a_streamed_refusal_as_serving_chat_sends_it_is_a_refusal(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Under --grammar-backend none SGLang's serving_chat answers a streamed constrained chat HTTP 200, then
    `data: {"error": {..., "code": 400}}` and [DONE] (the refserver does too). A service whose profile says
    structured_output = false refuses that way: it passes (it failed before as "HTTP 200 ... error event")."""
    with RefServerProcess("--grammar-backend", "none") as server:
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 8,
                "response_format": {"type": "json_object"}}
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200
    events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[0])["error"]["code"] == 400 and events[-1] == "[DONE]"
    profile = write_profile(tmp_path, "declared", {"none": ("NONE", ["--grammar-backend", "none"])},
                            service_extra={"none": "structured_output = false"})
    result = run_suite("generation", "--host", str(profile), "-k", "structured and chat- and sse")
    assert_no_crash(result)
    result.assert_outcomes(passed=4)


def _rambling_without_grammar(upstream: str) -> Rule:
    """A server whose grammar is silently off: the grammar fields dropped, the output runs to max_tokens."""
    def rule(method: str, path: str, body: Any) -> Reply | None:
        if method != "POST" or not isinstance(body, dict) or body.get("stream"):
            return None
        params = body.get("sampling_params")
        if isinstance(params, dict):
            body = {**body, "sampling_params": {**{k: v for k, v in params.items() if k not in GRAMMAR_FIELDS},
                                                "ignore_eos": True}}
        answer = httpx.post(upstream + path, json=body, timeout=60.0)
        return Reply(answer.status_code, answer.content,
                     content_type=answer.headers.get("content-type", "application/json"))
    return rule


def test_without_a_grammar_matcher_a_cut_output_could_not_be_checked(run_suite, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller has no xgrammar: an output cut by max_tokens can only be judged as a prefix by a grammar
    matcher, so the check is "could not check" naming the extra (before: a pass, with a warning), and
    the layer is not passed."""
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, \
            FaultProxy(server.url, _rambling_without_grammar(server.url)) as proxy:
        blocker = tmp_path / "blocked"
        for name in ("xgrammar",):
            (blocker / name).mkdir(parents=True)
            (blocker / name / "__init__.py").write_text(f"raise ImportError('{name} hidden by the test')\n")
        monkeypatch.setenv("PYTHONPATH", str(blocker))
        profile = tmp_path / "nomatcher.toml"
        profile.write_text('[host]\nname = "nomatcher"\nconnection = "local://"\n[services.dflash]\n'
                           f'kind = "external"\nurl = "{proxy.url}"\nalgorithm = "DFLASH"\n')
        result = run_suite("generation", "--host", str(profile), "-k",
                           "structured and generate-json_schema and whole and greedy", "-rs")
    assert_no_crash(result)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*could not check: *finished by length, so only a prefix can be asked of it: "
                                 "judging a json_schema output cut by max_tokens needs xgrammar's grammar matcher, "
                                 "and the controller has none: pip install 'pytest-dflash[[]grammar[]]'*"])
    assert verdict(run_suite.reports, "nomatcher")["layers"]["generation"]["outcome"] != "passed"


def test_a_reasoning_model_does_not_fail_the_sampler_checks_of_chat(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--reasoning-parser qwen3 thinks by default: the chat's text is in reasoning_content. The stop string and
    the seed variation read the whole output (they failed before with "greedy output ''" and "sampling is not
    sampling")."""
    profile = write_profile(tmp_path, "thinker", {"dflash": ("DFLASH", ["--reasoning-parser", "qwen3"])})
    result = run_suite("generation", "--host", str(profile), "-k",
                       "(stop_string or sampling_varies_with_seed) and chat")
    assert_no_crash(result)
    result.assert_outcomes(passed=2)


def test_the_deploy_gate_sees_a_server_without_a_grammar_backend(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Seed 002's fix: smoke's one constrained request fails --grammar-backend none, naming the flag, unless
    the profile says structured_output = false (then the 400 refusal passes)."""
    profile = write_profile(tmp_path, "gate002", {"off": ("DFLASH", ["--grammar-backend", "none"]),
                                                  "declared": ("NONE", ["--grammar-backend", "none"])},
                            service_extra={"declared": "structured_output = false"})  # fmt: skip
    result = run_suite("smoke", "--host", str(profile), "-k", "structured_output", "--gate", "generation")
    assert_no_crash(result)
    result.assert_outcomes(passed=1, failed=1)
    assert failed_tests(run_suite, "gate002") == {"test_structured_output[gate002/off]"}
    result.stdout.fnmatch_lines(["*off: its command has `--grammar-backend none`*seed 002*"])
    assert result.ret != 0
