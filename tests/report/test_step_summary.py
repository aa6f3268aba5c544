"""The GitHub step summary's Markdown table, and the versions the HTML report's metadata names: built from real
VerdictBuilders fed the same `dflash` entries the controller folds in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.report.html import versions_seen
from pytest_dflash.report.step_summary import SUMMARY_BYTES, append, markdown
from pytest_dflash.report.verdict import RunStatus, VerdictBuilder


def _entry(host: str, layer: str, **extra: Any) -> dict[str, Any]:
    return {"host": host, "profile": f"hosts/{host}.toml", "layer": layer, "services": ["dflash"], **extra}


def _builder(*hosts: str, failing: tuple[str, ...] = (), message: str = "boom") -> VerdictBuilder:
    builder = VerdictBuilder(run_id="abc123")
    for host in hosts:
        builder.add(f"suites/smoke/test_smoke.py::test_host_reachable[{host}]", "call", "passed",
                    _entry(host, "host"), "")
        if host in failing:
            diagnosis = [{"id": "flashinfer-sm12x-nvcc", "title": "t", "remedy": "r", "evidence": "e"}]
            builder.add(f"suites/smoke/test_smoke.py::test_service_ready[{host}/dflash]", "call", "failed",
                        _entry(host, "service", diagnosis=diagnosis), message)
            builder.add(f"suites/smoke/test_smoke.py::test_greedy_generation[{host}/dflash]", "setup", "skipped",
                        _entry(host, "generation", blocked=True), "blocked: service layer failed")
        else:
            builder.add(f"suites/smoke/test_smoke.py::test_service_ready[{host}/dflash]", "call", "passed",
                        _entry(host, "service"), "")
    return builder


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines() if line.startswith("| ")]


def test_table_has_a_row_per_host_failing_first_with_layer_outcomes_and_the_first_failure() -> None:
    text = markdown(_builder("a-ok", "b-bad", failing=("b-bad",)), {"layers": ["service"], "passed": False,
                                                                      "refused": []})
    assert text.startswith("### pytest-dflash verdict (run `abc123`)\n")
    assert "Gate `service`: **❌ failed**" in text
    header, bad, ok = _rows(text)
    assert header[:3] == ["host", "verdict", "host layer"] and header[-2:] == ["first failure", "diagnosis"]
    assert bad[:2] == ["b-bad", "❌ fail"] and ok[:2] == ["a-ok", "✅ pass"]
    outcomes = dict(zip(header, bad, strict=True))
    assert (outcomes["service"], outcomes["generation"], outcomes["kernels"]) == ("❌", "⛔ blocked", "–")
    assert outcomes["first failure"] == "`suites/smoke/test_smoke.py::test_service_ready[b-bad/dflash]`: boom"
    assert outcomes["diagnosis"] == "`flashinfer-sm12x-nvcc`"
    assert dict(zip(header, ok, strict=True))["first failure"] == ""


def test_partial_and_interrupted_runs_say_so() -> None:
    builder = _builder("a")
    builder.status = RunStatus(partial=("-k 'greedy'",))
    assert "**Partial:** -k 'greedy'" in markdown(builder) and "⚠️ partial" in markdown(builder)
    builder.status = RunStatus(interrupted="interrupted (Ctrl-C / SIGTERM / pytest.exit)")
    assert "**Interrupted:** interrupted (Ctrl-C" in markdown(builder) and "⛔ interrupted" in markdown(builder)


def test_cells_are_redacted_one_line_and_cannot_break_the_table() -> None:
    message = "Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123 | --api-key sk-secretsecretsecret\nsecond <b>line"
    text = markdown(_builder("h", failing=("h",), message=message))
    assert "abcdefghijklmnopqrstuvwxyz0123" not in text and "sk-secretsecretsecret" not in text
    header, row = _rows(text)
    assert len(row) == len(header)  # the pipe in the message is escaped, the newline gone
    failure = dict(zip(header, row, strict=True))["first failure"]
    assert "\\|" in failure and "second &lt;b>line" in failure


def test_a_huge_fleet_is_cut_to_the_cap_keeping_the_failing_hosts() -> None:
    hosts = [f"gpu-{i:04d}" for i in range(3000)]
    text = markdown(_builder(*hosts, failing=("gpu-2999",), message="x" * 500))
    assert len(text.encode()) <= SUMMARY_BYTES
    assert _rows(text)[1][0] == "gpu-2999"  # the one failing host first
    assert "more host(s) left out: cap 128 KB (see the verdict files)" in text


def test_append_adds_to_the_file_and_does_nothing_without_the_variable(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = pytester.parseconfigure()
    target = tmp_path / "summary.md"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    append(config, _builder("a"), None)
    assert not target.exists()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    target.write_text("before\n")
    append(config, _builder("a"), None)
    append(config, _builder("b"), None)
    text = target.read_text()
    assert text.startswith("before\n") and text.count("### pytest-dflash verdict") == 2


def test_versions_seen_name_hosts_only_when_they_differ() -> None:
    builder = _builder("a", "b", "c")
    builder.host("a").services["dflash"] = {"version": "0.5.17"}
    builder.host("b").services["dflash"] = {"version": "0.5.17"}
    builder.host("a").facts.update({"torch": {"version": "2.9.1+cu129"},
                                    "serving_stack": {"flashinfer-python": "0.7.2.post1", "torch": "2.9.1"}})
    builder.host("b").facts.update({"torch": {"version": "2.8.0+cu128"}})
    builder.host("c").facts.update({"serving_stack": {"torch": "2.8.0+cu128"}})  # torch's facts not probed
    assert versions_seen(builder) == {"SGLang": "0.5.17", "torch": "2.8.0+cu128 (b, c), 2.9.1+cu129 (a)",
                                      "FlashInfer": "0.7.2.post1"}
    assert versions_seen(_builder("c")) == {}


def test_a_failure_text_with_escapes_reaches_the_summary_written_out() -> None:
    """A verdict read back from a file (a merged shard, an older run) is not trusted to be scrubbed."""
    text = markdown(_builder("h", failing=("h",), message="\x1b[2J\x1b]0;PWNED\x07 boom\r::error::x"))
    assert "\\x1b[2J\\x1b]0;PWNED\\x07 boom\\r::error::x" in text.replace("\\\\", "\\")
    assert not [c for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f]


def test_a_gate_failed_by_a_skipped_layer_names_the_host_the_layer_and_its_outcome() -> None:
    """Before: "Gate `service,generation`: **❌ failed**" and no reason (nothing refused it, no test failed)."""
    builder = _builder("a")
    builder.add("suites/smoke/test_smoke.py::test_greedy_generation[a/dflash]", "setup", "skipped",
                _entry("a", "generation"), "Skipped: no greedy service")
    gate = builder.gate(["service", "generation"])
    assert not gate["passed"]
    text = markdown(builder, gate)
    assert "Gate `service,generation`: **❌ failed**\n- failed: a generation: every check was skipped, none " \
           "passed" in text, text
    from pytest_dflash.report.first_screen import gate_block

    assert "<li>failed: a generation: every check was skipped, none passed" in gate_block(gate)
    assert "<li>a: generation skipped</li>" in gate_block({**gate, "why": []})  # an older verdict: no `why`
    assert "<li>the one reason</li>" in gate_block({**gate, "why": ["the one reason"]})
