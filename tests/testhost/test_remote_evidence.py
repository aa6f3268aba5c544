"""Evidence of a failing test: the journal tail is limited to that test's time window, and secrets
planted in the unit and its output appear nowhere (terminal, HTML report, verdict JSON).

The unit (units/refserver-secrets.service) runs the refserver with `--api-key`, gets HF_TOKEN,
PROBE_BEARER and DB_PASSWORD as Environment= lines, and leaves a probe that logs a timestamped line
carrying all of them every 0.2 s (a line that also matches a diagnosis signature, so it is quoted as
a diagnosis' evidence). The refserver's 3rd generation request hangs (`--inject hang=3`): readiness
makes two, so the greedy test's request times out, and that test fails with evidence.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Callable
from pathlib import Path

import pytest
from remote_helpers import Guest, RefUnit, SuiteRun, unit_name, write_profile
from testhost import TestHost

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

Runs = Callable[..., SuiteRun]
PROBE_LINE = re.compile(r"dflash-probe t=(\d+\.\d+)")
MASK = "***REDACTED***"


def _token(n: int) -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(n))


def test_journal_window_and_redaction(testhost: TestHost, guest: Guest, runs: Runs, tmp_path: Path) -> None:
    # Values no generic pattern could guess: each must be caught by the mechanism meant for it
    # (--api-key flag and the client's known key, HF token shape and *_TOKEN=, Bearer, password in URL).
    planted = {"api_key": f"ak{_token(30)}", "HF_TOKEN": f"hf_{_token(34)}", "PROBE_BEARER": _token(40),
               "DB_PASSWORD": _token(24)}
    spec = RefUnit(unit_name("secrets"), "DFLASH", "--inject hang=3", template="refserver-secrets.service",
                   env={k: planted[k] for k in ("HF_TOKEN", "PROBE_BEARER", "DB_PASSWORD")},
                   vars={"api_key": planted["api_key"]}, api_key_env="DFLASH_SCENARIO_API_KEY")
    guest.track(spec.unit)
    profile = write_profile(tmp_path, testhost, "secrets", {"dflash": spec})
    html = tmp_path / "report.html"
    run = runs(profile, "--provision", "-m", "host or service or generation", "--request-timeout=3s",
               f"--html={html}", "--self-contained-html", env={"DFLASH_SCENARIO_API_KEY": planted["api_key"]})
    outcome = run.wait(180)
    outcome.assert_clean()
    test = "test_greedy_generation[secrets/dflash]"
    data = outcome.verdict("secrets")
    assert [f["test"].rsplit("::", 1)[1] for f in data["failures"]] == [test], data["failures"]

    # The secrets really were there, in the guest's journal (the api key: on the unit's command line,
    # shown redacted below; readiness passed, so the client sent it and the server required it).
    journal = guest.journal(spec.unit)
    text = "\n".join(str(e.get("MESSAGE", "")) for e in journal)
    for name in ("HF_TOKEN", "PROBE_BEARER", "DB_PASSWORD"):
        assert planted[name] in text, name

    # The window: the failing test's journal section holds the probe lines written while it ran, none
    # written before it started (the probe wrote one every 0.2 s all along, so there were some just before).
    started = outcome.started(test)
    section = outcome.section("journal secrets/dflash since", test)
    inside = [float(t) for t in PROBE_LINE.findall(section)]
    assert len(inside) >= 5, section[-3000:]  # the request timed out after 3 s
    assert min(inside) >= started - 0.5, (min(inside) - started, section[:2000])
    written = [float(m.group(1)) for e in journal if (m := PROBE_LINE.search(str(e.get("MESSAGE", ""))))]
    assert [t for t in written if started - 2.0 <= t < started - 0.5], "no probe line just before the test?"
    assert "dflash-probe-start" not in section and "The server is fired up and ready to roll!" not in section
    assert MASK in section and f"Authorization: Bearer {MASK}" in section

    # The unit's properties are evidence too: the key on its command line, the tokens in its environment.
    unit = outcome.section("service secrets/dflash", test)
    assert f"--api-key {MASK}" in unit and f"HF_TOKEN={MASK}" in unit and f"DB_PASSWORD={MASK}" in unit, unit
    # A diagnosis quotes the line that matched; it goes into the verdict JSON, redacted.
    quoted = [d for d in data["failures"][0]["diagnosis"] if d["id"] == "model-path-missing"]
    assert quoted and MASK in quoted[0]["evidence"], data["failures"][0]["diagnosis"]

    # Nowhere: terminal output, HTML report, verdict JSON (and anything else the run wrote there).
    page = html.read_text()
    assert "journal secrets/dflash since" in page  # the evidence is in the report, redacted
    artefacts = {"terminal": outcome.out, "html": page,
                 **{p.name: p.read_text() for p in outcome.reports.iterdir() if p.is_file()}}
    assert "secrets.verdict.json" in artefacts
    for where, content in artefacts.items():
        for name, value in planted.items():
            assert value not in content, f"{name} leaked into {where}"
