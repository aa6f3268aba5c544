"""pytest-html helpers: the report's title names its run, a skip reason reads as a sentence, JUnit's view of
the user properties is flat (the controller's `dflash` dict stays on the report)."""

from __future__ import annotations

import json

from pytest_dflash.evidence.attach import junit_user_properties
from pytest_dflash.report.html import run_title, skip_sentence
from pytest_dflash.report.verdict import VerdictBuilder


def _builder(outcomes: dict[str, str]) -> VerdictBuilder:
    builder = VerdictBuilder("run1")
    for host, outcome in outcomes.items():
        info = {"host": host, "layer": "service", "services": ["dflash"], "blocked": False, "diagnosis": []}
        builder.add(f"suites/smoke/test_smoke.py::test_service_ready[{host}/dflash]", "call", outcome, info,
                    "ServiceCrashed: service dflash died" if outcome == "failed" else "")
    return builder


def test_the_title_names_the_hosts_and_their_verdicts() -> None:
    assert run_title(_builder({"h200": "failed"})) == "pytest-dflash h200: FAIL"
    assert run_title(_builder({"local": "passed"})) == "pytest-dflash local: PASS"
    fleet = _builder({f"gpu-{i:02d}": "passed" for i in range(28)} | {f"bad-{i}": "failed" for i in range(4)})
    assert run_title(fleet) == "pytest-dflash, 32 hosts: 28 pass, 4 fail (bad-0, bad-1, bad-2, …)"


def test_a_skip_reads_as_a_sentence_with_where_it_was_raised() -> None:
    assert skip_sentence("/work/main/suites/env/test_env.py", 47, "Skipped: no service of h200 is NONE") == (
        "Skipped: no service of h200 is NONE (suites/env/test_env.py, line 47)")
    assert skip_sentence("/x/conftest.py", None, "blocked: service layer failed") == (
        "Skipped: blocked: service layer failed (/x/conftest.py)")


def test_junit_gets_flat_properties_and_json_never_a_repr() -> None:
    info = {"host": "local", "profile": "local.toml", "services": ["dflash"]}
    perf = [{"host": "local", "service": "dflash", "output_tok_s": 812.5}]
    properties = [("dflash", info), ("dflash.host", "local"), ("dflash_perf", perf), ("attempts", 2)]
    clean = junit_user_properties(properties)
    assert clean == [("dflash.host", "local"), ("dflash_perf", json.dumps(perf, separators=(",", ":"))),
                     ("attempts", 2)]
    assert properties[0] == ("dflash", info), "the report's own list is not changed"
