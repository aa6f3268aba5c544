"""Issue 32 item 7: the HTML report and fleet-summary.html of a failing three-host fleet (two healthy hosts,
one whose service dies on its first sampled request: FlashInfer's SM 12.x JIT), as headless Chromium renders
them: the heading, the verdict matrix, the failing host's diagnosis and remedy, and no SVG text outside its
plot. Screenshots land in reports/browser/ (kept by CI as artifacts; docs/ shows one of each)."""

from __future__ import annotations

import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from e2e_helpers import write_profile
from support.browser import dump_dom, screenshot
from support.pytest_runs import assert_no_crash

SHOTS = Path(__file__).parents[2] / "reports" / "browser"
LONG = "beta-node-with-a-rather-long-name.rack-17.datacenter-west.example.internal"
INVENTORY = f"""
all:
  hosts:
    alpha: {{dflash_profile: good.toml}}
    {LONG}: {{dflash_profile: good.toml}}
    gamma: {{dflash_profile: sm120.toml}}
"""
# Appended to a copy of a page: after the page's own scripts, every drawn SVG text whose box (the browser's
# getBBox, in the SVG's own units) reaches outside its SVG is listed in <body data-overflow>.
MEASURE = """<script>window.addEventListener('load', function () {
  var out = [], n = 0;
  document.querySelectorAll('svg').forEach(function (svg) {
    var box = svg.viewBox.baseVal, width = box && box.width ? box.width : svg.width.baseVal.value;
    svg.querySelectorAll('text').forEach(function (t) {
      if (t.getAttribute('transform')) return;
      var b = t.getBBox(); n += 1;
      if (b.width && (b.x < -0.5 || b.x + b.width > width + 0.5))
        out.push(t.textContent + ' @' + b.x.toFixed(0) + '..' + (b.x + b.width).toFixed(0) + '/' + width);
    });
  });
  // host names that wrap onto a second line in the verdict tables ("gpu-" / "a")
  var wrapped = [];
  document.querySelectorAll('#matrix tbody td:first-child, table.dflash-verdict td:first-child').forEach(function (td) {
    var range = document.createRange(), tops = {};
    range.selectNodeContents(td);
    Array.prototype.forEach.call(range.getClientRects(), function (r) { if (r.width) tops[Math.round(r.top)] = 1; });
    if (Object.keys(tops).length > 1) wrapped.push(td.textContent);
  });
  document.body.setAttribute('data-wrapped', wrapped.join(' | '));
  var firstTable = document.querySelector('table');
  document.body.setAttribute('data-first-table', firstTable ? (firstTable.id || firstTable.className) : '');
  document.body.setAttribute('data-texts', String(n));
  document.body.setAttribute('data-overflow', out.join(' | '));
});</script>"""


class _Dom(HTMLParser):
    """The bits of a rendered page the test reads: h1, the title, table rows (cells' text), body attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.h1 = self.title = ""
        self.body: dict[str, str] = {}
        self.rows: dict[str, list[list[str]]] = {}
        self._stack: list[str] = []
        self._table: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = a
        elif tag == "table":
            self._table.append(a.get("id") or a.get("class") or "")
        elif tag == "tr" and self._table:
            self.rows.setdefault(self._table[-1], []).append([])
        elif tag in ("td", "th") and self._table and self.rows.get(self._table[-1]):
            self.rows[self._table[-1]][-1].append("")
        self._stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._table:
            self._table.pop()
        while self._stack and self._stack.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        where = self._stack[-1] if self._stack else ""
        if where == "h1":
            self.h1 += data
        elif where == "title" and "svg" not in self._stack:
            self.title += data
        row = self.rows.get(self._table[-1]) if self._table else None
        if row and row[-1] and ("td" in self._stack or "th" in self._stack):
            row[-1][-1] += data


def _render(page: Path, tmp_path: Path) -> tuple[str, _Dom]:
    measured = tmp_path / f"measured-{page.name}"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>", 1))
    dom = dump_dom(measured, timeout_s=120)
    parsed = _Dom()
    parsed.feed(dom)
    return dom, parsed


@pytest.fixture
def browser() -> None:
    if shutil.which("chromium") is None and not os.environ.get("DFLASH_REQUIRE_BROWSER"):
        pytest.skip("chromium is not installed (apt-get install chromium; DFLASH_REQUIRE_BROWSER=1 makes this fail)")


def test_a_failing_three_host_fleet_as_chromium_renders_it(browser: None, run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_profile(tmp_path, "good", {"dflash": ("DFLASH", [])})
    write_profile(tmp_path, "sm120", {"dflash": ("DFLASH", ["--inject", "flashinfer-sm120"])})
    inventory = tmp_path / "fleet.yml"
    inventory.write_text(INVENTORY)
    page = tmp_path / "report.html"
    result = run_suite("smoke", "--fleet", str(inventory), f"--html={page}")
    assert_no_crash(result)
    assert result.ret == 1, result.stdout.str()[-3000:]
    fleet_page = run_suite.reports / "fleet-summary.html"

    # fleet-summary.html: heading, the matrix with the failing host first, its diagnosis and remedy
    dom, fleet = _render(fleet_page, tmp_path)
    assert fleet.h1 == "pytest-dflash fleet summary"
    matrix = fleet.rows["matrix"]
    assert matrix[0][:3] == ["host", "verdict", "host layer"] and matrix[0].count("host") == 1, matrix[0]
    assert [row[:2] for row in matrix[1:]] == [["gamma", "FAIL"], ["alpha", "PASS"], [LONG, "PASS"]], matrix
    gamma = dom.split('id="h-gamma"', 1)[1].split("</article>", 1)[0]
    assert re.search(r'class="diag"><b>\[[a-z0-9-]+\]</b> \S.*?<div class="remedy">remedy: \S', gamma), gamma[:3000]
    assert int(fleet.body["data-texts"]) >= 5, "the readiness plot was drawn"
    # the matrix is the page's first table (before: trend and perf tables above it), no host name wraps
    assert fleet.body["data-first-table"] == "matrix", fleet.body["data-first-table"]
    assert fleet.body["data-wrapped"] == "", fleet.body["data-wrapped"]
    assert fleet.body["data-overflow"] == "", fleet.body["data-overflow"]

    # the pytest-html report: its title names the run, the verdict table, the failing host's diagnosis
    dom, report = _render(page, tmp_path)
    assert report.title.strip() == "pytest-dflash, 3 hosts: 2 pass, 1 fail (gamma)", report.title
    verdicts = report.rows["dflash-verdict"]
    assert verdicts[0][:3] == ["host", "verdict", "host layer"], verdicts[0]
    assert {row[0]: row[1] for row in verdicts[1:] if row and row[0]} == {"alpha": "PASS", LONG: "PASS",
                                                                         "gamma": "FAIL"}
    assert "sampling-jit-first-sampled-request" in dom and "remedy" in dom
    assert report.body["data-overflow"] == "", report.body["data-overflow"]
    assert report.body["data-wrapped"] == "", report.body["data-wrapped"]
    # the cold start: the failing host first, its service that died drawn, one legend for the page
    hosts = re.findall(r'class="dflash-cold-start" data-host="([^"]+)"', dom)
    assert hosts == ["gamma", "alpha", LONG], hosts
    gamma_start = dom.split('class="dflash-cold-start" data-host="gamma"', 1)[1].split("</svg>", 1)[0]
    # drawn up to where it stopped: its port and greedy answer, then the first sampled request that killed it
    assert "never ready (stopped in its first sampled request, after " in gamma_start
    assert 'data-phase="first_greedy"' in gamma_start and 'data-phase="stopped"' in gamma_start
    assert dom.count("<title>start-up phases</title>") == 1

    screenshot(fleet_page, SHOTS / "fleet-summary.png")
    screenshot(page, SHOTS / "html-report.png", height=1500)  # down to the cold start
