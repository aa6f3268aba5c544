"""CI-native reports from a real run: JUnit (read back with junitparser), pytest-html (read back with an HTML
parser), and the GitHub step summary (Markdown), all from one smoke run under xdist against real refservers: a
healthy NONE and a DFLASH whose first sampled request kills it (FlashInfer on SM 12.x)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import write_profile
from junitparser import Failure, JUnitXml, Properties, Skipped, TestCase
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash import __version__


class _Report(HTMLParser):
    """pytest-html 4's page: the header cells are HTML, the rows and the Environment a JSON blob in an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[str] = []
        self.blob: dict[str, Any] = {}
        self._in_results_head = False
        self._th: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "thead" and found.get("id") == "results-table-head":
            self._in_results_head = True
        elif tag == "th" and self._in_results_head:
            self._th = ""
        elif tag == "div" and found.get("id") == "data-container":
            self.blob = json.loads(found["data-jsonblob"] or "{}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "th" and self._th is not None:
            self.headers.append(self._th.strip())
            self._th = None
        elif tag == "thead":
            self._in_results_head = False

    def handle_data(self, data: str) -> None:
        if self._th is not None:
            self._th += data


class _Cells(HTMLParser):
    """One results row (a list of '<td class="col-…">…</td>' strings) -> {column: (text, title)}."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, tuple[str, str]] = {}
        self._col: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "td":
            self._col = (found.get("class") or "").removeprefix("col-")
            self.cells[self._col] = ("", found.get("title") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._col = None

    def handle_data(self, data: str) -> None:
        if self._col is not None:
            text, title = self.cells[self._col]
            self.cells[self._col] = (text + data, title)


def _cells(row: list[str]) -> dict[str, tuple[str, str]]:
    parser = _Cells()
    parser.feed("".join(row))
    return parser.cells


def _properties(case: TestCase) -> dict[str, str]:
    props = case.child(Properties)  # type: ignore[no-untyped-call]
    return {p.name: p.value for p in props} if props is not None else {}


def test_junit_html_and_step_summary_from_one_failing_xdist_run(run_suite, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    profile = write_profile(tmp_path, "ci", {"none": ("NONE", []),
                                             "dflash": ("DFLASH", ["--inject", "flashinfer-sm120"])})
    junit, page, summary = tmp_path / "junit.xml", tmp_path / "report.html", tmp_path / "step-summary.md"
    summary.write_text("earlier step's summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = run_suite("smoke", "--host", str(profile), "-n", "2", f"--junitxml={junit}", f"--html={page}")
    assert_no_crash(result)
    assert result.ret == 1
    data = verdict(run_suite.reports, "ci")
    assert data["verdict"] == "fail"

    # JUnit, read back with a JUnit parser: flat properties on every dflash testcase, evidence in <failure>
    # (under xdist's loadgroup a test's name ends in "@<host>", its xdist group)
    cases = {case.name.split("@")[0]: case for suite in JUnitXml.fromfile(str(junit)) for case in suite}
    ready = cases["test_service_ready[ci/dflash]"]
    props = _properties(ready)
    assert {k: props[k] for k in ("dflash.host", "dflash.layer", "dflash.service", "dflash.algorithm",
                                  "dflash.verdict")} == {
        "dflash.host": "ci", "dflash.layer": "service", "dflash.service": "dflash", "dflash.algorithm": "DFLASH",
        "dflash.verdict": "failed"}
    diagnosis_ids = props["dflash.diagnosis"].split(",")
    assert diagnosis_ids[0] == "flashinfer-sm12x-nvcc" and "sampling-jit-first-sampled-request" in diagnosis_ids
    failure = next(r for r in ready.result if isinstance(r, Failure))
    assert "ServiceCrashed: service dflash died during readiness" in (failure.message or "")
    text = failure.text or ""
    assert "RuntimeError: FlashInfer requires GPUs with sm75 or higher" in text  # the log tail
    assert "[flashinfer-sm12x-nvcc]" in text and "remedy:" in text  # the diagnosis with its remedy
    assert "state=killed by SIGKILL" in text  # the process state
    blocked = _properties(cases["test_greedy_generation[ci/dflash]"])
    assert blocked["dflash.verdict"] == "blocked" and blocked["dflash.algorithm"] == "DFLASH"
    assert any(isinstance(r, Skipped) for r in cases["test_greedy_generation[ci/dflash]"].result)
    healthy = _properties(cases["test_greedy_generation[ci/none]"])
    assert healthy["dflash.verdict"] == "passed" and healthy["dflash.algorithm"] == "NONE"
    assert "dflash.diagnosis" not in healthy
    gpu = _properties(cases["test_gpus_visible[ci]"])
    assert gpu["dflash.verdict"] == "skipped" and gpu["dflash.layer"] == "host" and "dflash.service" not in gpu

    # pytest-html, read back with an HTML parser: the dflash columns after Test, the run's metadata
    report = _Report()
    report.feed(page.read_text())
    assert report.headers[:6] == ["Result", "Test", "Host", "Layer", "Service", "Diagnosis"], report.headers
    rows = {nodeid.rsplit("::", 1)[-1].split("@")[0]: [_cells(t["resultsTableRow"]) for t in tests]
            for nodeid, tests in report.blob["tests"].items()}
    failed = next(r for r in rows["test_service_ready[ci/dflash]"] if r["result"][0] == "Failed")
    assert failed["host"][0] == "ci" and failed["layer"][0] == "service" and failed["service"][0] == "dflash"
    assert failed["diagnosis"][0].split(", ")[0] == "flashinfer-sm12x-nvcc"
    assert "FlashInfer cannot target this SM 12.x GPU" in failed["diagnosis"][1]  # the titles, on hover
    passed = rows["test_greedy_generation[ci/none]"][0]
    assert (passed["host"][0], passed["layer"][0], passed["service"][0], passed["diagnosis"][0]) == (
        "ci", "generation", "none", "")
    environment = report.blob["environment"]
    assert environment["dflash run id"] == data["run_id"]
    assert environment["dflash plugin"] == __version__
    assert environment["SGLang"] == "0.5.17"  # /server_info of the healthy service

    # the step summary: appended once (by the controller, not by each worker), a Markdown table
    text = summary.read_text()
    assert text.startswith("earlier step's summary\n")
    assert text.count("### pytest-dflash verdict") == 1
    assert f"(run `{data['run_id']}`)" in text
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["host", "verdict", "host layer", "env", "kernels", "service", "generation", "parity", "perf",
                      "first failure", "diagnosis"]
    assert set(lines[1].replace("|", "")) == {"-"}
    row = dict(zip(header, (c.strip() for c in lines[2].strip("|").split(" | ")), strict=True))
    assert row["host"] == "ci" and "fail" in row["verdict"]
    assert row["service"] == "❌" and row["generation"] == "⛔ blocked" and row["kernels"] == "–"
    assert row["first failure"].startswith("`suites/smoke/test_smoke.py::test_service_ready[ci/dflash]@ci`")
    assert row["diagnosis"].startswith("`flashinfer-sm12x-nvcc`")


def test_no_junit_evidence_block_without_junitxml(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The evidence goes into the failure text only for JUnit: the terminal shows it once, as report sections."""
    profile = write_profile(tmp_path, "quiet", {"dflash": ("DFLASH", ["--inject", "missing-soundfile"])})
    result = run_suite("smoke", "--host", str(profile), "-m", "service")
    assert_no_crash(result)
    result.assert_outcomes(failed=1, skipped=3)
    text = result.stdout.str()
    assert "dflash diagnosis" in text and "[soundfile-missing]" in text
    assert "dflash evidence for JUnit" not in text


def test_with_junitxml_the_terminal_shows_the_evidence_once(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """JUnit gets the evidence in <failure>; the terminal shows it as report sections only, not a second time."""
    profile = write_profile(tmp_path, "once", {"dflash": ("DFLASH", ["--inject", "missing-soundfile"])})
    junit = tmp_path / "junit.xml"
    result = run_suite("smoke", "--host", str(profile), "-m", "service", f"--junitxml={junit}")
    assert_no_crash(result)
    result.assert_outcomes(failed=1, skipped=3)
    text = result.stdout.str()
    assert "dflash evidence for JUnit" not in text
    sections = [line for line in text.splitlines() if line.strip("-_ ").startswith("dflash diagnosis")]
    assert len(sections) == 1, sections
    cases = {case.name: case for suite in JUnitXml.fromfile(str(junit)) for case in suite}
    failure = next(r for r in cases["test_service_ready[once/dflash]"].result if isinstance(r, Failure))
    assert "--- dflash evidence for JUnit ---" in (failure.text or "")
    assert "[soundfile-missing]" in (failure.text or "")
    assert "dflash evidence" not in (failure.message or "") and len(failure.message or "") < 600


def test_an_unwritable_step_summary_is_one_line_not_an_error(run_suite, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    profile = write_profile(tmp_path, "nosummary", {"none": ("NONE", [])})
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))  # a directory: cannot be appended to
    result = run_suite("smoke", "--host", str(profile), "-m", "host")
    assert_no_crash(result)
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"dflash: $GITHUB_STEP_SUMMARY {tmp_path}: cannot append the verdict table: *"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert verdict(run_suite.reports, "nosummary")["verdict"] == "partial"  # -m host: a narrowed run


def test_a_collection_error_gets_an_html_row_with_empty_dflash_cells(pytester: pytest.Pytester,
                                                                     tmp_path: Path) -> None:
    pytester.makepyfile(test_broken="import no_such_module_here\n")
    profile = write_profile(tmp_path, "broken", {"none": ("NONE", [])})
    page = tmp_path / "report.html"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", str(profile), f"--html={page}",
                                           f"--dflash-report={tmp_path / 'reports'}")
    assert_no_crash(result)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # pytest stops after a collection error
    report = _Report()
    report.feed(page.read_text())
    (row,) = [_cells(t["resultsTableRow"]) for tests in report.blob["tests"].values() for t in tests]
    assert row["result"][0] == "Error" and "test_broken.py" in row["testId"][0]
    assert [row[c][0] for c in ("host", "layer", "service", "diagnosis")] == ["", "", "", ""]
