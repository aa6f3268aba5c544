"""What the terminal and the HTML title say is what the verdict says: no PARTIAL line under a FAIL, the run's
scope named as what ran of what, one gate line that names its scope and what it ignored, partial and
interrupted in the HTML title."""

from __future__ import annotations

from pytest_dflash.report.gate import why_lines
from pytest_dflash.report.html import run_title
from pytest_dflash.report.scope import Scope
from pytest_dflash.report.verdict import (
    HostStatus,
    RunStatus,
    VerdictBuilder,
    gate_line,
    summary_lines,
)

EVERY = ("env", "generation", "host", "kernels", "parity", "perf", "service", "smoke")


def _add(builder: VerdictBuilder, host: str, layer: str, outcome: str, *, blocked: bool = False) -> None:
    info = {"host": host, "layer": layer, "services": ["dflash"], "blocked": blocked, "diagnosis": []}
    builder.add(f"suites/smoke/test_smoke.py::test_{layer}[{host}/dflash]", "call", outcome, info,
                "blocked: service layer failed" if blocked else ("it broke" if outcome == "failed" else ""))


def test_no_partial_line_under_a_fail() -> None:
    """A host whose only test failed (the rest blocked), in a run narrowed by -m: FAIL, and neither 'PARTIAL: no
    test of this host passed' under it nor a run-wide 'PARTIAL: -m …' line (there is no partial host)."""
    builder = VerdictBuilder("run1")
    _add(builder, "broken", "service", "failed")
    _add(builder, "broken", "generation", "skipped", blocked=True)
    builder.status = RunStatus(partial=("-m 'service'",))
    lines = summary_lines(builder)
    assert lines[0].startswith("broken: FAIL ")
    assert not any("PARTIAL" in line for line in lines), lines
    assert "narrowed: -m 'service'" in lines


def test_a_partial_host_still_says_why() -> None:
    builder = VerdictBuilder("run1")
    _add(builder, "narrow", "host", "passed")
    builder.status = RunStatus(partial=("-k 'gpu'",), scope=Scope(("host",), EVERY),
                               hosts={"narrow": HostStatus(selected=1, finished=1, deselected=2)})
    lines = summary_lines(builder)
    assert lines[0].startswith("narrow: PARTIAL ")
    assert "    PARTIAL: 2 test(s) of this host deselected after collection (1 of 3 ran)" in lines
    assert "scope: host (1 of 8 suites) (a pass is a pass of the checks these define)" in lines
    assert "PARTIAL: -k 'gpu' — a pass here does not make a host green in the fleet view" in lines


def test_a_chosen_suite_is_a_scope_the_gate_line_names() -> None:
    """Before: a subset of the suites made the host partial while a gate over it passed."""
    builder = VerdictBuilder("run1")
    _add(builder, "h", "service", "passed")
    builder.status = RunStatus(scope=Scope(("service",), EVERY))
    assert builder.hosts["h"].final_verdict(builder.status) == "pass"
    gate = builder.gate(["service"])
    assert gate["passed"] and gate["why"] == [] and gate["scope"]["text"] == "service (1 of 8 suites)"
    assert gate_line(gate) == "gate service: PASSED; scope: service (1 of 8 suites)"
    builder.status = RunStatus(partial=("-k 'ready'",), scope=Scope(("service",), EVERY))
    gate = builder.gate(["service"])
    assert gate["refused"] == ["the run was narrowed: -k 'ready'"]
    assert why_lines(gate) == ["  gate refused: the run was narrowed: -k 'ready'"]


def test_a_gated_layer_outside_the_scope_is_named() -> None:
    builder = VerdictBuilder("run1")
    _add(builder, "h", "service", "passed")
    builder.status = RunStatus(scope=Scope(("service",), EVERY),
                               hosts={"h": HostStatus(selected=1, finished=1, layers=("service",))})
    gate = builder.gate(["service", "perf"])
    assert not gate["passed"]
    assert gate["why"] == ["failed: h perf: not in scope: service (1 of 8 suites) define(s) no check of the perf "
                           "layer"]
    assert gate_line(gate) == "gate service,perf: FAILED on h; scope: service (1 of 8 suites)"


def test_the_gate_line_says_what_it_ignored() -> None:
    builder = VerdictBuilder("run1")
    for host in ("local", "randdraft"):
        _add(builder, host, "service", "passed")
        _add(builder, host, "generation", "passed")
    _add(builder, "randdraft", "perf", "failed")
    gate = builder.gate(["service", "generation"])
    assert gate["passed"] and gate["outside"] == ["randdraft perf failed"]
    assert gate_line(gate) == "gate service,generation: PASSED; outside the gate: randdraft perf failed"
    clean = VerdictBuilder("run2")
    _add(clean, "local", "service", "passed")
    assert gate_line(clean.gate(["service"])) == "gate service: PASSED"


def test_the_html_title_says_partial_and_interrupted() -> None:
    """The title reads each host's final verdict (the one its verdict file has), not what its tests said."""
    builder = VerdictBuilder("run1")
    _add(builder, "narrow", "service", "passed")
    builder.status = RunStatus(partial=("-m 'service'",))
    assert run_title(builder) == "pytest-dflash narrow: PARTIAL"
    builder.status = RunStatus(interrupted="interrupted (Ctrl-C / SIGTERM / pytest.exit)")
    assert run_title(builder) == "pytest-dflash narrow: INTERRUPTED"
    _add(builder, "other", "service", "passed")
    builder.status = RunStatus(hosts={"other": HostStatus(selected=2, finished=1, lost=("t[other]",))})
    assert run_title(builder) == "pytest-dflash, 2 hosts: 1 pass, 1 interrupted (other)"


def test_a_failed_gate_names_the_hosts_it_failed_on() -> None:
    builder = VerdictBuilder("run1")
    _add(builder, "gpu-01", "service", "passed")
    _add(builder, "gpu-17", "service", "failed")
    gate = builder.gate(["service"])
    assert gate_line(gate) == "gate service: FAILED on gpu-17"
    assert gate["why"] == ["failed: gpu-17 service: 1 check(s) failed (first: "
                           "suites/smoke/test_smoke.py::test_service[gpu-17/dflash]: it broke)"]
