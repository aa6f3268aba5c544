"""Evidence stays bounded and redacted end to end: real pytest runs (pytester) of a test file against real
refserver processes, with JUnit XML (`--junitxml`, captured output included), the pytest-html report and the
verdict JSON read back as files.

The refserver is started through a small launcher that writes to the service log what real SGLang writes
there (its server_args line; here also an argv list and an environment dump), then execs the refserver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import ROOT, write_profile
from support.pytest_runs import assert_no_crash

ARTEFACT_LIMIT = 200 * 1024  # what a CI artefact of one failing test may weigh, whatever the server said
LOG_LINE = "[2026-11-30 10:00:00] Scheduler spam " + "S" * 20_000
RECORDED = ROOT / "tests" / "data" / "sglang-0.5.17-h200" / "logs" / "server_dflash_graph.log"
SECRET = "sk-e2e-planted-0123456789abcdefKEY"  # the refserver's --api-key, in its log as SGLang logs it
AWS_SECRET = "e2eAwsSecret/K7MDENG+bPxRfiCYEXAMPLE"  # only in the launcher's environment dump
HF_TOKEN = "hf_e2eplantedplantedplantedplanted"  # only in the launcher's environment dump

LAUNCHER = """\
import os, sys
sys.stdout.write(open({preamble!r}).read())
sys.stdout.flush()
os.execv(sys.executable, [sys.executable, "-m", "pytest_dflash.refserver", *sys.argv[1:]])
"""


def launcher_profile(tmp_path: Path, name: str, preamble: str, services: dict[str, list[str]],
                     service_extra: dict[str, str] | None = None) -> Path:
    """A profile of refservers started through the launcher, which first writes `preamble` to the log."""
    (tmp_path / f"{name}.preamble").write_text(preamble)
    launcher = tmp_path / f"{name}_launch.py"
    launcher.write_text(LAUNCHER.format(preamble=str(tmp_path / f"{name}.preamble")))
    profile = write_profile(tmp_path, name, {s: ("DFLASH", args) for s, args in services.items()},
                            service_extra=service_extra)
    text = profile.read_text().replace('"-m", "pytest_dflash.refserver"', json.dumps(str(launcher)))
    assert str(launcher) in text
    profile.write_text(text)
    return profile


def run(pytester: pytest.Pytester, tmp_path: Path, profile: Path, *args: str) -> tuple[pytest.RunResult, str, str,
                                                                                           str]:
    """Run the pytester test file; returns (result, JUnit XML, HTML, verdict JSON) as text."""
    junit, html, reports = tmp_path / "junit.xml", tmp_path / "report.html", tmp_path / "reports"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", str(profile), "-rA",
                                           f"--junitxml={junit}", "-o", "junit_logging=all", f"--html={html}",
                                           f"--dflash-report={reports}", "--request-timeout=20s", *args)
    assert_no_crash(result)
    verdict = (reports / f"{profile.stem}.verdict.json").read_text()
    return result, junit.read_text(), html.read_text(), verdict


def test_a_multi_megabyte_message_and_log_stay_small_and_say_what_was_cut(pytester: pytest.Pytester,
                                                                          tmp_path: Path) -> None:
    pytester.makepyfile(test_huge="""
        def test_a_huge_response_is_reported(dflash_client):
            body = "B" * 3_000_000 + "END-OF-BODY"
            print("P" * 2_000_000)
            assert len(body) < 10, f"response far larger than max_tokens allows: {body}"
    """)
    preamble = "\n".join(LOG_LINE for _ in range(150)) + "\n"  # 3 MB of log inside the test's window
    profile = launcher_profile(tmp_path, "big", preamble, {"dflash": []})
    result, junit, html, verdict = run(pytester, tmp_path, profile)
    assert result.ret == 1
    result.assert_outcomes(failed=1)
    terminal = result.stdout.str() + result.stderr.str()
    for name, text in (("terminal", terminal), ("JUnit", junit), ("HTML", html), ("verdict", verdict)):
        size = len(text.encode())
        assert size < ARTEFACT_LIMIT, f"{name}: {size:,} bytes"
        assert "bytes cut: cap" in text, name  # the cut is stated, not silent
    # the failure keeps its head (the assertion) and its tail (where it failed)
    assert "response far larger than max_tokens allows: BBBB" in terminal
    assert "per failure text]" in terminal and "per captured output]" in terminal and "per log tail]" in terminal
    # the log section is the END of the log: the last lines the server wrote, after the cut spam
    assert "The server is fired up and ready to roll!" in html and "per log tail]" in html
    assert html.count("S" * 1000) < 20  # not the 3 MB of it
    data = json.loads(verdict)
    (failure,) = data["failures"]
    assert failure["message"].startswith("AssertionError: response far larger than max_tokens allows: BBB")
    assert len(failure["message"].encode()) <= 1024 and "bytes cut: cap 1 KB per" in failure["message"]
    assert data["verdict"] == "fail"


def test_the_api_key_in_the_servers_log_appears_nowhere(pytester: pytest.Pytester, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_E2E_KEY", SECRET)
    line = next(x for x in RECORDED.read_text().splitlines() if "server_args=ServerArgs(" in x)
    # the recorded line up to its api_key, then the two *_token* settings the assertions below read: the whole
    # line is 11.5 KB, and the refserver's own start-up lines after it pushed it out of the 16 KB tail
    head = line[:line.index("api_key=None")]
    planted = f"{head}api_key='{SECRET}', kt_max_deferred_experts_per_token=None, num_reserved_decode_tokens=512)"
    # server_args first: the log tail (16 KB) keeps the end, and these lines must be in it
    preamble = (f"{planted}\n"
                f"[launch] argv=['python3', '-m', 'sglang.launch_server', '--api-key', '{SECRET}', '--port', '1']\n"
                f"[launch] env: AWS_SECRET_ACCESS_KEY={AWS_SECRET} HF_TOKEN={HF_TOKEN} HF_HUB_OFFLINE=1\n")
    pytester.makepyfile(test_keyed="""
        def test_uses_the_key(dflash_client):
            key = dflash_client.api_key
            print(f"the key is {key}")  # a bare literal: only the run's own knowledge of its key hides it
            assert key is None, f"request failed: Authorization: Bearer {key}; argv ['--api-key', '{key}']"

        def test_after(dflash_service):
            pass
    """)
    key_extra = 'api_key_env = "DFLASH_E2E_KEY"'
    profile = launcher_profile(tmp_path, "keyed", preamble,
                               {"good": ["--api-key", SECRET], "dies": ["--api-key", SECRET, "--inject",
                                                                         "flashinfer-sm120"]},
                               service_extra={"good": key_extra, "dies": key_extra})
    result, junit, html, verdict = run(pytester, tmp_path, profile)
    assert result.ret == 1
    terminal = result.stdout.str() + result.stderr.str()
    for name, text in (("terminal", terminal), ("JUnit", junit), ("HTML", html), ("verdict", verdict)):
        for secret in (SECRET, AWS_SECRET, HF_TOKEN, SECRET[:20]):
            assert secret not in text, f"{secret} in the {name}"
    # what must stay visible does: the masked forms, and SGLang's harmless *_token* settings from its log
    assert "Authorization: Bearer ***REDACTED***" in terminal
    assert "--api-key ***REDACTED***" in terminal  # the service's command line in its evidence
    assert "the key is ***REDACTED***" in terminal
    data = json.loads(verdict)
    assert data["verdict"] == "fail"
    assert any(b["message"].startswith("blocked: ") for b in data["blocked"]), data["blocked"]
    for text in (terminal, html):
        assert "AWS_SECRET_ACCESS_KEY=***REDACTED***" in text
        assert "kt_max_deferred_experts_per_token=None" in text and "num_reserved_decode_tokens=512" in text
    assert "api_key='***REDACTED***'" in terminal
