"""CI-native reports from a real run: JUnit (read back with junitparser), pytest-html (read back with an HTML
parser), and the GitHub step summary (Markdown), all from one smoke run under xdist against real refservers: a
healthy NONE and a DFLASH whose first sampled request kills it (FlashInfer on SM 12.x)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import SUITES, write_profile
from junitparser import Failure, JUnitXml, Properties, Skipped, TestCase
from support.browser import dump_dom, screenshot
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


@pytest.mark.heavy
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
    # (under xdist a test's name is its name without xdist: no "@<group>")
    cases = {case.name: case for suite in JUnitXml.fromfile(str(junit)) for case in suite}
    ready = cases["test_service_ready[ci/dflash]"]
    props = _properties(ready)
    assert {k: props[k] for k in ("dflash.host", "dflash.layer", "dflash.service", "dflash.algorithm",
                                  "dflash.verdict")} == {
        "dflash.host": "ci", "dflash.layer": "service", "dflash.service": "dflash", "dflash.algorithm": "DFLASH",
        "dflash.verdict": "failed"}
    assert "dflash" not in props, "the controller's dict is not a JUnit property (flat dflash.* only)"
    # one root cause, one diagnosis (its consequences folded into it)
    assert props["dflash.diagnosis"] == "flashinfer-sm12x-nvcc"
    failure = next(r for r in ready.result if isinstance(r, Failure))
    # message=: the diagnosis and its remedy first, as the failure's own first line
    assert (failure.message or "").startswith("[flashinfer-sm12x-nvcc] FlashInfer cannot target")
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
    rows = {nodeid.rsplit("::", 1)[-1]: [_cells(t["resultsTableRow"]) for t in tests]
            for nodeid, tests in report.blob["tests"].items()}
    failed = next(r for r in rows["test_service_ready[ci/dflash]"] if r["result"][0] == "Failed")
    assert failed["host"][0] == "ci" and failed["layer"][0] == "service" and failed["service"][0] == "dflash"
    assert failed["diagnosis"][0].split(", ")[0] == "flashinfer-sm12x-nvcc"
    assert "FlashInfer cannot target this SM 12.x GPU" in failed["diagnosis"][1]  # the titles, on hover
    passed = rows["test_greedy_generation[ci/none]"][0]
    assert (passed["host"][0], passed["layer"][0], passed["service"][0], passed["diagnosis"][0]) == (
        "ci", "generation", "none", "")
    (skipped,) = [t["log"] for nodeid, tests in report.blob["tests"].items() for t in tests
                  if "test_gpus_visible[ci]" in nodeid]
    assert skipped.startswith('<span class="dflash-skip-reason">Skipped: no GPU on ci'), skipped  # under xdist too
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
    assert row["first failure"].startswith("`suites/smoke/test_smoke.py::test_service_ready[ci/dflash]`")
    assert row["diagnosis"].startswith("`flashinfer-sm12x-nvcc`")


def test_no_junit_evidence_block_without_junitxml(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The evidence goes into the failure text only for JUnit: the terminal shows it once, as report sections."""
    profile = write_profile(tmp_path, "quiet", {"dflash": ("DFLASH", ["--inject", "missing-soundfile"])})
    result = run_suite("smoke", "--host", str(profile), "-m", "service")
    assert_no_crash(result)
    result.assert_outcomes(failed=1, skipped=4)
    text = result.stdout.str()
    assert "dflash diagnosis" in text and "[soundfile-missing]" in text
    assert "dflash evidence for JUnit" not in text


def test_with_junitxml_the_terminal_shows_the_evidence_once(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """JUnit gets the evidence in <failure>; the terminal shows it as report sections only, not a second time."""
    profile = write_profile(tmp_path, "once", {"dflash": ("DFLASH", ["--inject", "missing-soundfile"])})
    junit = tmp_path / "junit.xml"
    result = run_suite("smoke", "--host", str(profile), "-m", "service", f"--junitxml={junit}")
    assert_no_crash(result)
    result.assert_outcomes(failed=1, skipped=4)
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


class _Page(HTMLParser):
    """The page's <title>, its dflash cold-start blocks (host -> the bars' phases) and every <svg> it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.svgs = 0
        self.phases: dict[str, list[str]] = {}
        self._in_title = False
        self._host: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "title" and not self.svgs and self._host is None:
            self._in_title = True
        elif tag == "svg":
            self.svgs += 1
        elif tag == "div" and "dflash-cold-start" in (found.get("class") or ""):
            self._host = found.get("data-host") or ""
            self.phases[self._host] = []
        elif tag == "rect" and self._host is not None and found.get("data-phase"):
            self.phases[self._host].append(found["data-phase"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag == "div":
            self._host = None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data


def _seed_trend(reports: Path, host: str, *, previous: dict[str, float], good_runs: dict[str, list[float]]) -> None:
    """What earlier runs of this host left in the report dir: the previous fleet summary (each service's
    ready_s) and history/<host>/good-runs.json (the readiness of its recent good runs)."""
    summary = {"schema": "pytest-dflash/fleet-summary/1", "generated": "2026-12-01T02:00:00+0000", "run_ids": ["r0"],
               "hosts": {host: {"verdict": "pass", "layers": {"host": "passed", "service": "passed"},
                                "services": {name: {"ready_s": ready} for name, ready in previous.items()},
                                "metrics": {}}}}
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "fleet-summary.json").write_text(json.dumps(summary))
    count = len(next(iter(good_runs.values())))
    runs = [{"run_id": f"r{i}", "finished": f"2026-11-2{i}T02:00:00+0000", "finished_ts": 1795000000.0 + i,
             "numbers": {f"service:{name}.ready_s": values[i] for name, values in good_runs.items()}}
            for i in range(count)]
    (reports / "history" / host).mkdir(parents=True)
    (reports / "history" / host / "good-runs.json").write_text(json.dumps({"host": host, "runs": runs}))


def test_one_healthy_run_reports_cleanly_in_junit_html_and_the_trend(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One passing smoke run (two NONE refservers) after earlier good runs: `noisy`'s readiness has varied a lot
    between good runs and is no regression whatever this run takes (the old raw percentage against the
    previous run's 0.05 s printed one every time); `fast` used to be ready in 0.01 s and now is not, which is
    one, printed with its rule. JUnit carries flat properties only (no `dflash` repr), the HTML report is
    titled by its run, draws the cold start as SVG and says why a test was skipped in a sentence."""
    profile = write_profile(tmp_path, "ci", {"noisy": ("NONE", []), "fast": ("NONE", [])})
    _seed_trend(run_suite.reports, "ci", previous={"noisy": 0.05, "fast": 0.01},
                good_runs={"noisy": [0.05, 40.0, 1.0, 8.0, 0.5], "fast": [0.01, 0.011, 0.012, 0.01, 0.011]})
    junit, page = tmp_path / "junit.xml", tmp_path / "report.html"
    result = run_suite("smoke", "--host", str(profile), "-m", "host or service", f"--junitxml={junit}",
                       f"--html={page}")
    assert_no_crash(result)
    assert result.ret == 0

    # the trend: one regression line, for `fast` only, with its rule
    lines = [line for line in result.stdout.lines if line.startswith("perf regressions")]
    assert len(lines) == 1 and "service:noisy.ready_s" not in lines[0], lines
    result.stdout.fnmatch_lines(["perf regressions: ci service:fast.ready_s 0.01 -> * (+*%), outside the last 5 "
                                 "good runs' range 0.01-0.012 by > 25%"])
    noisy = next(p for p in json.loads((run_suite.reports / "fleet-summary.json").read_text())["trend"]["perf"]
                 if p["metric"] == "service:noisy.ready_s")
    assert not noisy["regression"] and noisy["rule"].startswith("within the last 5 good runs' range 0.05-40")

    # JUnit, read back with a JUnit parser: flat string properties, none of them a Python repr
    cases = [case for suite in JUnitXml.fromfile(str(junit)) for case in suite]
    assert cases
    for case in cases:
        props = _properties(case)
        assert "dflash" not in props and props["dflash.host"] == "ci", (case.name, props)
        for name, value in props.items():
            assert not value.startswith(("{'", "[{'", "('")), (case.name, name, value)
    gpu = next(case for case in cases if case.name == "test_gpus_visible[ci]")
    assert _properties(gpu)["dflash.verdict"] == "skipped"

    # the HTML report: title, cold-start timeline, skip reasons as sentences
    text = page.read_text()
    parsed = _Page()
    parsed.feed(text)
    assert parsed.title == "pytest-dflash ci: PARTIAL"  # -m narrowed it: what the verdict file says
    assert set(parsed.phases) == {"ci"} and parsed.svgs >= 1
    assert parsed.phases["ci"].count("first_sampled") == 2 and "port_open" in parsed.phases["ci"]
    assert text.count('class="dflash-cold-start-phases"') == 1  # the same phases as columns, under the timeline
    report = _Report()
    report.feed(text)
    source = (SUITES / "smoke" / "test_smoke.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "gpus_visible(dflash_gpu)" in text)
    logs = [t["log"] for nodeid, tests in report.blob["tests"].items() for t in tests if "gpus_visible" in nodeid]
    assert logs == [f'<span class="dflash-skip-reason">Skipped: no GPU on ci: nvidia-smi not found on PATH (and its '
                    f"profile names none) (suites/smoke/test_smoke.py, line {line})</span>\n"], logs
    assert not any("('" in t["log"] and "test_smoke.py'," in t["log"]
                   for tests in report.blob["tests"].values() for t in tests), "a tuple repr in a log"



def test_the_html_report_as_chromium_renders_it(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """In a real browser (headless Chromium, after pytest-html's script built the table from its JSON): the title
    names the run, the cold-start timeline is drawn, a skipped row's reason is a sentence, and no row shows a
    Python tuple; a screenshot is taken (report-screenshot.png beside the report, to look at)."""
    profile = write_profile(tmp_path, "shot", {"none": ("NONE", [])})
    page = tmp_path / "report.html"
    result = run_suite("smoke", "--host", str(profile), "-m", "host or service", f"--html={page}")
    assert_no_crash(result)
    dom = dump_dom(page, timeout_s=120)
    parsed = _Page()
    parsed.feed(dom)
    assert parsed.title == "pytest-dflash shot: PARTIAL"  # -m narrowed it: what the verdict file says
    assert parsed.phases.get("shot"), "the cold-start timeline is in the rendered page"
    assert 'class="dflash-skip-reason">Skipped: no GPU on shot' in dom
    assert "test_smoke.py'," not in dom, "a (path, line, reason) tuple in the rendered page"
    screenshot(page, tmp_path / "report-screenshot.png", height=2000, timeout_s=120)
