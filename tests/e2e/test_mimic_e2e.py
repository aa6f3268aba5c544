"""The plugin against a later SGLang release (issue 25 item 5): `pytest --attach URL suites/smoke` on a
refserver started with `--mimic-version 0.5.23` (no meta_info aliases, no /get_load, /ready, launch_command,
served_model_name; docs/sglang-versions.md); the launch command read as what was requested, recorded as a fact,
and compared with the profile's command. Real pytest runs against real refservers."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import toml_list, write_profile
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")


@pytest.mark.parametrize("algorithm", ["DFLASH", "DDTREE"])
def test_smoke_passes_on_0_5_23(run_suite, tmp_path: Path, algorithm: str) -> None:  # type: ignore[no-untyped-def]
    """DFLASH by --attach URL; DDTREE, whose port turns its grammar backend off itself, by a profile that says
    structured_output = false (attached without one it fails, naming that: the test below)."""
    with RefServerProcess("--mimic-version", "0.5.23", "--speculative-algorithm", algorithm) as server:
        if algorithm == "DFLASH":
            result = run_suite("smoke", "--attach", server.url)
            name = host_name(server.url)
        else:
            profile = tmp_path / "later.toml"
            profile.write_text(f'[host]\nname = "later"\nconnection = "local://"\n\n[services.attached]\n'
                               f'kind = "external"\nurl = "{server.url}"\nalgorithm = "DDTREE"\n'
                               "structured_output = false\n")
            result = run_suite("smoke", "--host", str(profile))
            name = "later"
    assert_no_crash(result)
    data = verdict(run_suite.reports, name)
    assert data["tests_verdict"] == "pass", result.stdout.str()[-3000:]
    assert data["services"]["attached"]["algorithm"] == algorithm
    assert "acceptance:attached" in data["metrics"] or data["services"]["attached"].get("accept_length")


def test_an_attached_ddtree_server_without_a_profile_fails_smoke_naming_its_grammar_backend(run_suite) -> None:  # type: ignore[no-untyped-def]
    """The ddtree port turns its grammar backend off itself (/server_info: grammar_backend none). Attached with
    no profile to say structured_output = false, smoke's constrained request names it (seed 002), and nothing
    else fails; with the profile saying so (test_smoke_passes_on_0_5_23), smoke passes."""
    with RefServerProcess("--mimic-version", "0.5.23", "--speculative-algorithm", "DDTREE") as server:
        result = run_suite("smoke", "--attach", server.url)
    assert_no_crash(result)
    data = verdict(run_suite.reports, host_name(server.url))
    assert data["tests_verdict"] == "fail", result.stdout.str()[-3000:]
    assert [f["test"].split("::")[-1].split("[")[0] for f in data["failures"]] == ["test_structured_output"]
    assert "its /server_info says grammar_backend = none" in data["failures"][0]["message"]


SECRET = "sk-later-0123456789abcdefKEY"


def external_profile(tmp_path: Path, url: str, algorithm: str, command: list[str] | None = None) -> Path:
    """A profile attaching one service by URL (kind = "external"), with the API key from the environment and,
    when given, the command the profile says the server runs (as a stale unit's profile would)."""
    lines = ["[host]", 'name = "later"', 'connection = "local://"', "", "[services.attached]", 'kind = "external"',
             f'url = "{url}"', f'algorithm = "{algorithm}"', 'api_key_env = "DFLASH_E2E_KEY"']
    if command:
        lines.append(f"command = {toml_list(command)}")
    path = tmp_path / "later.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_attached_0_5_23_asks_its_launch_command_what_was_requested(run_suite, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No command in the profile: what the server was started with is read from /server_info launch_command, so
    SGLang's quiet override of the draft attention backend is seen (a note) where nothing was compared before;
    the launch command (API key masked) and the frontend are facts of the verdict and the HTML report."""
    monkeypatch.setenv("DFLASH_E2E_KEY", SECRET)
    args = ["--mimic-version", "0.5.23", "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8",
            "--speculative-draft-attention-backend", "flashmla", "--api-key", SECRET]
    html = tmp_path / "later.html"
    with RefServerProcess(*args) as server:
        profile = external_profile(tmp_path, server.url, "DFLASH")
        result = run_suite("smoke", "--host", str(profile), "-k", "profiles_speculation", f"--html={html}")
    assert_no_crash(result)
    data = verdict(run_suite.reports, "later")
    assert data["tests_verdict"] == "pass", result.stdout.str()[-3000:]
    facts = data["services"]["attached"]
    assert facts["launch_command"] == ("--host 127.0.0.1 --port 0 --speculative-algorithm DFLASH "
                                       "--speculative-num-draft-tokens 8 --speculative-draft-attention-backend "
                                       "flashmla --api-key ***REDACTED***")
    assert facts["frontend"] == "python"
    notes = [n for n in data["notes"] if n.startswith("later/attached")]
    assert any("requested: from the server's launch_command (its profile has no command)" in n for n in notes), notes
    assert any("--speculative-draft-attention-backend flashmla asked, /server_info "
               "speculative_draft_attention_backend = 'flashinfer'" in n for n in notes), notes
    page = html.read_text()
    assert "launch command later/attached" in page and "frontend later/attached" in page
    for text in (page, (run_suite.reports / "later.verdict.json").read_text(), result.stdout.str()):
        assert SECRET not in text


def test_a_server_not_started_from_its_profiles_command_fails(run_suite, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale unit: the profile asks EAGLE3 with topk 4, the running server was started with topk 1. SGLang's
    own adjustments make the served values alone a note (topk 1 drafts num_steps + 1 tokens); the launch command
    names both values and fails the check."""
    monkeypatch.setenv("DFLASH_E2E_KEY", SECRET)
    started = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
               "--speculative-num-draft-tokens", "8"]
    profile_command = ["python3", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", "{port}",
                       *started[:-3], "4", "--speculative-num-draft-tokens", "8", "--api-key", "$KEY",
                       "--mem-fraction-static", "0.8"]
    with RefServerProcess("--mimic-version", "0.5.20", *started, "--api-key", SECRET) as server:
        profile = external_profile(tmp_path, server.url, "EAGLE3", profile_command)
        profile.write_text(profile.read_text().replace('api_key_env = "DFLASH_E2E_KEY"',
                                                       f'api_key_env = "DFLASH_E2E_KEY"\nport = {server.port}'))
        result = run_suite("smoke", "--host", str(profile), "-k", "profiles_speculation")
    assert_no_crash(result)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*later/attached does not serve the speculation its profile asks for: the running "
                                 "server was started with --speculative-eagle-topk 1; the profile asks for "
                                 "--speculative-eagle-topk 4 (it was not started from the profile's command: a "
                                 "stale or edited unit, or a server started by hand)*"])
    data = verdict(run_suite.reports, "later")
    notes = [n for n in data["notes"] if n.startswith("later/attached")]
    assert any("the running server was started without --mem-fraction-static; the profile's command has "
               "--mem-fraction-static 0.8" in n for n in notes), notes
    assert not any("--api-key" in n for n in notes), notes  # a secret (masked, or $KEY) is never compared


BYPASS_ENV = 'env = { SGLANG_DIAG_BYPASS_HEALTH_GENERATE = "1" }'


@pytest.mark.parametrize("fault", ["wedge=3", ""], ids=["wedged", "healthy"])
def test_with_the_health_bypass_a_wedged_engine_is_still_stuck(run_suite, tmp_path: Path, fault: str) -> None:  # type: ignore[no-untyped-def]
    """SGLang 0.5.19+ with SGLANG_DIAG_BYPASS_HEALTH_GENERATE=1 in the profile's env: /health_generate answers 200
    on a wedged engine. The service is still judged stuck (from /metrics and a streamed probe, the evidence saying
    why /health_generate was not asked); the same server without the wedge passes smoke and the service layer,
    whose /health_generate check notes that its 200 proves no generation."""
    args = ["--mimic-version", "0.5.19", *(["--inject", fault] if fault else [])]
    profile = write_profile(tmp_path, "sick", {"plain": ("NONE", args)}, service_extra={"plain": BYPASS_ENV})
    result = run_suite("smoke" if fault else ["smoke", "service"], "--host", str(profile), "--request-timeout=3s")
    assert_no_crash(result)
    data = verdict(run_suite.reports, "sick")
    if not fault:
        assert data["tests_verdict"] == "pass", result.stdout.str()[-3000:]
        assert any(n.startswith("sick/plain: its /health_generate 200 proves no generation: "
                                "SGLANG_DIAG_BYPASS_HEALTH_GENERATE=1") for n in data["notes"]), data["notes"]
        return
    assert result.ret == 1
    failures = [f for f in data["failures"] if f.get("services") == ["plain"]]
    assert len(failures) == 1, data["failures"]
    assert "engine-stuck" in [d.get("id") for d in failures[0]["diagnosis"]], failures[0]
    text = result.stdout.str()
    assert "is stuck: POST " in text, text[-4000:]
    assert ("/health_generate not asked: SGLANG_DIAG_BYPASS_HEALTH_GENERATE=1 in the profile's env of sick/plain: "
            "SGLang 0.5.19+ then answers /health and /health_generate 200 without a generation") in text, text[-4000:]
    assert all("is stuck" in b["message"] for b in data["blocked"] if b.get("services") == ["plain"]), data["blocked"]
