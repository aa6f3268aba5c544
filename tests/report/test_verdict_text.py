"""What the terminal and the HTML title say is what the verdict says: no PARTIAL line under a FAIL, a subset of
the suites named as what ran of what, one gate line that names what it ignored, partial and interrupted in the
HTML title."""

from __future__ import annotations

from pytest_dflash.report.html import run_title
from pytest_dflash.report.verdict import (
    HostStatus,
    RunStatus,
    VerdictBuilder,
    gate_line,
    subset_reason,
    summary_lines,
)


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
    builder.status = RunStatus(partial=(subset_reason({"host"}, {"host", "smoke", "perf"}),),
                               hosts={"narrow": HostStatus(selected=1, finished=1, deselected=2)})
    lines = summary_lines(builder)
    assert lines[0].startswith("narrow: PARTIAL ")
    assert "    PARTIAL: 2 test(s) of this host deselected after collection (1 of 3 ran)" in lines
    assert "PARTIAL: ran host: 1 of 3 suites — a pass here does not make a host green in the fleet view" in lines


def test_a_subset_names_what_ran_of_what() -> None:
    every = {"env", "generation", "host", "kernels", "parity", "perf", "service", "smoke"}
    assert subset_reason({"perf"}, every) == "ran perf: 1 of 8 suites"
    assert subset_reason({"perf", "parity"}, every) == "ran parity, perf: 2 of 8 suites"


def test_a_subset_of_the_suites_does_not_refuse_a_gate_other_narrowing_does() -> None:
    builder = VerdictBuilder("run1")
    _add(builder, "h", "service", "passed")
    builder.status = RunStatus(partial=(subset_reason({"service"}, {"service", "perf"}),))
    assert builder.gate(["service"])["passed"]
    builder.status = RunStatus(partial=("-k 'ready'",))
    assert builder.gate(["service"])["refused"] == ["the run was narrowed: -k 'ready'"]


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
    builder.status = RunStatus(partial=("ran service: 1 of 8 suites",))
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
    assert gate_line(builder.gate(["service"])) == "gate service: FAILED on gpu-17"
