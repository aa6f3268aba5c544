"""The run's verdicts on the controller: every test report folded in, the gate applied to the exit code,
verdict files written at session end, and the terminal summary."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_dflash.evidence.attach import first_line, skip_message
from pytest_dflash.evidence.redact import redact
from pytest_dflash.report.verdict import VerdictBuilder, summary_lines
from pytest_dflash.run.stash import BUILDER_KEY, GATE_KEY, REPORTED_KEY, RUN_KEY


class VerdictCollector:
    """Folds every test report into the host verdicts (controller side; also without xdist)."""

    def __init__(self, builder: VerdictBuilder) -> None:
        self.builder = builder

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == "dflash" and isinstance(value, dict):
                self.builder.add(report.nodeid, report.when, report.outcome, value, _message(report))


def _message(report: pytest.TestReport) -> str:
    if report.skipped:
        return skip_message(report)[:300]
    if report.failed:
        for title, body in report.sections:
            if title.endswith("dflash diagnosis") and body:
                return body.splitlines()[0][:300]
        return redact(first_line(report.longreprtext))
    return ""


def finish(session: pytest.Session) -> None:
    """Controller, session end: apply the gate to the exit status and write the verdict files."""
    config = session.config
    run = config.stash[RUN_KEY]
    builder = config.stash[BUILDER_KEY]
    gate_layers = config.stash.get(GATE_KEY, [])
    gate = builder.gate(gate_layers) if gate_layers else None
    if gate is not None and session.exitstatus in (0, 1):
        session.exitstatus = 0 if gate["passed"] else 1
    paths = builder.write(run.options.report_dir, exit_code=int(session.exitstatus), gate=gate)
    config.stash[REPORTED_KEY] = [str(p) for p in paths]


def terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    builder = config.stash[BUILDER_KEY]
    terminalreporter.section("dflash verdict")
    for line in summary_lines(builder):
        terminalreporter.write_line(line)
    gate_layers = config.stash.get(GATE_KEY, [])
    if gate_layers:
        gate = builder.gate(gate_layers)
        terminalreporter.write_line(f"gate {','.join(gate_layers)}: {'PASSED' if gate['passed'] else 'FAILED'}")
    for path in config.stash.get(REPORTED_KEY, []):
        terminalreporter.write_line(f"verdict: {path}")
