"""What people read is the verdict: the pytest-html report of a partial run and of a failing run, rendered by a
real browser (headless chromium, after pytest-html's scripts ran), says in its title, its heading and its
verdict table what the verdict file says. Screenshots go to reports/ (git-ignored; CI keeps them)."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from e2e_helpers import ROOT, write_profile
from support.browser import dump_dom, screenshot
from support.pytest_runs import assert_no_crash, verdict


class _Rendered(HTMLParser):
    """The rendered page: its <title>, its <h1>, and the dflash verdict table as rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.title = self.heading = ""
        self.rows: list[list[str]] = []
        self._in: str | None = None
        self._table = self._body = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self._body = True
        elif (tag == "title" and not self._body) or tag == "h1":  # an SVG's <title> is a tooltip, not the page's
            self._in = tag
        elif tag == "table" and "dflash-verdict" in (dict(attrs).get("class") or ""):
            self._table = True
        elif tag == "tr" and self._table:
            self.rows.append([])
        elif tag in ("td", "th") and self._table and self.rows:
            self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None
        elif tag == "table":
            self._table = False

    def handle_data(self, data: str) -> None:
        if self._in == "title":
            self.title += data
        elif self._in == "h1":
            self.heading += data
        elif self._table and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data

    def verdict_of(self, host: str) -> str:
        return next(row[1].strip() for row in self.rows if row and row[0].strip() == host)


def _rendered(page: Path, shot: str) -> _Rendered:
    parsed = _Rendered()
    parsed.feed(dump_dom(page, timeout_s=120))  # two shared cores under -n 2: chromium may start slowly
    screenshot(page, ROOT / "reports" / shot, timeout_s=120)
    return parsed


def test_a_partial_run_reads_partial_in_the_browser(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """suites/host narrowed by -k: the verdict file says partial, and so do the terminal, the page's title, its
    heading and its verdict table (before: 'pytest-dflash narrow: PASS'); the narrowing is named in words. (A suite
    chosen alone is a declared scope, not a narrowing: docs/gating.md.)"""
    profile = write_profile(tmp_path, "narrow", {"plain": ("NONE", [])})
    page = tmp_path / "report.html"
    result = run_suite("host", "--host", str(profile), f"--html={page}", "-k", "not oom")
    assert_no_crash(result)
    assert verdict(run_suite.reports, "narrow")["verdict"] == "partial"
    result.stdout.fnmatch_lines(["narrow: PARTIAL *", "PARTIAL: -k 'not oom' — *"])
    assert " of env, generation" not in result.stdout.str()
    parsed = _rendered(page, "html-report-partial.png")
    assert parsed.title == "pytest-dflash narrow: PARTIAL"
    assert parsed.heading.strip() == "pytest-dflash narrow: PARTIAL"
    assert parsed.verdict_of("narrow") == "PARTIAL", parsed.rows
    assert any("-k 'not oom'" in " ".join(row) for row in parsed.rows), parsed.rows


def test_a_failing_run_reads_fail_in_the_browser(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A DFLASH refserver that dies at import (SGLang without soundfile), smoke narrowed by -m to the layers
    that need it: no test of the host passes. FAIL in the verdict file, the terminal, the title, the heading
    and the verdict table; no PARTIAL line under the FAIL (before: 'PARTIAL: no test of this host passed' and
    'PARTIAL: -m …' under it), the narrowing said as what it is."""
    profile = write_profile(tmp_path, "broken", {"dflash": ("DFLASH", ["--inject", "missing-soundfile"])})
    page = tmp_path / "report.html"
    result = run_suite("smoke", "--host", str(profile), "-m", "service or generation", f"--html={page}")
    assert_no_crash(result)
    assert result.ret == 1
    assert verdict(run_suite.reports, "broken")["verdict"] == "fail"
    result.stdout.fnmatch_lines(["broken: FAIL *", "narrowed: -m 'service or generation'"])
    assert "PARTIAL" not in result.stdout.str()
    parsed = _rendered(page, "html-report-fail.png")
    assert parsed.title == "pytest-dflash broken: FAIL"
    assert parsed.heading.strip() == "pytest-dflash broken: FAIL"
    assert parsed.verdict_of("broken") == "FAIL", parsed.rows
    assert any(row[1].startswith("FAILED ") for row in parsed.rows if len(row) > 1), parsed.rows


@pytest.fixture(autouse=True)
def _screenshots_folder() -> None:
    (ROOT / "reports").mkdir(exist_ok=True)


def test_an_interrupted_run_reads_interrupted_in_the_browser(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """-x stops the run at the first failure: the verdict file says interrupted, and so does the page, with why."""
    profile = write_profile(tmp_path, "stopped", {"dflash": ("DFLASH", ["--inject", "missing-soundfile"])})
    page = tmp_path / "report.html"
    result = run_suite("smoke", "--host", str(profile), "-x", f"--html={page}")
    assert_no_crash(result)
    assert verdict(run_suite.reports, "stopped")["verdict"] == "interrupted"
    parsed = _rendered(page, "html-report-interrupted.png")
    assert parsed.title == parsed.heading.strip() == "pytest-dflash stopped: INTERRUPTED"
    assert parsed.verdict_of("stopped") == "INTERRUPTED", parsed.rows
    assert any(" ".join(row).strip().startswith("INTERRUPTED: stopped early") for row in parsed.rows), parsed.rows
