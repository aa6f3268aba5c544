"""What people read is the verdict: the pytest-html report of a partial run and of a failing run, rendered by a
real browser (headless chromium, after pytest-html's scripts ran), says in its title, its heading and its
verdict table what the verdict file says. Screenshots go to reports/ (git-ignored; CI keeps them)."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from e2e_helpers import ROOT, write_profile
from support.browser import dump_dom, measured_body, screenshot
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


# Appended to a copy of the page: after its scripts ran, what the first screen shows, as <body> attributes:
# the order of the verdict block and pytest-html's Environment table, whether that table is hidden, the
# heading's colour, the diagnosis box's contrast, and every shortened SVG label that was cut inside a word.
FIRST_SCREEN = """<script>window.addEventListener('load', function () {
  function rgb(c) { return (c.match(/[0-9.]+/g) || []).slice(0, 3).map(Number); }
  function lum(c) { return rgb(c).map(function (v) { v /= 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); })
    .reduce(function (a, v, i) { return a + v * [0.2126, 0.7152, 0.0722][i]; }, 0); }
  function contrast(el) { var s = getComputedStyle(el), bg = el, b = 'rgba(0, 0, 0, 0)';
    while (bg && (b = getComputedStyle(bg).backgroundColor) === 'rgba(0, 0, 0, 0)') bg = bg.parentElement;
    var a = lum(s.color), z = lum(b || 'rgb(255,255,255)');
    return (Math.max(a, z) + 0.05) / (Math.min(a, z) + 0.05); }
  var first = document.getElementById('dflash-first-screen'), env = document.getElementById('environment');
  var b = document.body;
  b.setAttribute('data-first-before-env', String(!!(first && env &&
    (first.compareDocumentPosition(env) & Node.DOCUMENT_POSITION_FOLLOWING))));
  b.setAttribute('data-env-hidden', String(!!env && env.offsetHeight === 0));
  b.setAttribute('data-title-colour', getComputedStyle(document.getElementById('title')).color);
  b.setAttribute('data-first-text', first ? first.innerText : '');
  var boxes = [];
  document.querySelectorAll('.dflash-diagnosis pre').forEach(function (p) { boxes.push(contrast(p).toFixed(1)); });
  b.setAttribute('data-diagnosis-contrast', boxes.join(' '));
  var cut = [], svgText = [];
  document.querySelectorAll('svg text').forEach(function (t) {
    var tip = t.querySelector('title'), shown = '';
    t.childNodes.forEach(function (n) { if (n.nodeName !== 'title') shown += n.textContent; });
    svgText.push(shown);
    if (!tip) return;
    var whole = tip.textContent, head = shown.split('…')[0];
    // a shortened label keeps whole words: the text goes on after its kept part with a space or a separator
    if (whole.indexOf(head) !== 0 || /[A-Za-z0-9]/.test(whole.charAt(head.length) || ' ') &&
        /[A-Za-z0-9]$/.test(head)) cut.push(shown + ' <- ' + whole);
  });
  b.setAttribute('data-cut', cut.join(' | '));
  b.setAttribute('data-svg-text', svgText.join(' '));
});</script>"""



def _first_screen(page: Path, tmp_path: Path) -> dict[str, str]:
    copy = tmp_path / f"first-screen-{page.name}"
    copy.write_text(page.read_text())
    return measured_body(copy, FIRST_SCREEN)


@pytest.mark.heavy
def test_the_first_screen_says_verdict_gate_why_and_what_changed(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two nights of one host, gated on service,generation. Night one passes. Night two its unit's command
    says 6 draft tokens instead of 8 and the service dies on its first sampled request (FlashInfer's SM 12.x
    JIT). The HTML's first screen, as chromium renders it: a red heading and banner, then the gate FAILED with
    the layer and why, the diagnosis, and what changed — the command's draft tokens 8 → 6, not the served
    configuration as "→ absent" — all above pytest-html's Environment table, which is collapsed. Before: a
    black heading, the Environment table first, no gate anywhere, 11 "→ absent" rows and "run the env layer".
    The diagnosis box reads dark on pale (before: light grey on pink), and no plot label is cut in a word
    (before: the cold-start reason was cut in the middle, dropping "nvcc too old")."""
    night = "night"
    write_profile(tmp_path, night, {"dflash": ("DFLASH", [])})
    gate = ("--gate", "service,generation")
    first = run_suite("smoke", "--host", str(tmp_path / f"{night}.toml"), *gate)
    assert_no_crash(first)
    assert first.ret == 0, first.stdout.str()[-3000:]
    write_profile(tmp_path, night, {"dflash": ("DFLASH", ["--speculative-num-draft-tokens", "6",
                                                          "--inject", "flashinfer-sm120"])})
    page = tmp_path / "report.html"
    second = run_suite("smoke", "--host", str(tmp_path / f"{night}.toml"), *gate, f"--html={page}")
    assert_no_crash(second)
    assert second.ret == 1
    # the terminal's fleet lines name the command's change and what could not be compared
    out = second.stdout.str()
    assert "command --speculative-num-draft-tokens 8 -> 6" in out, out[-3000:]
    assert "night: not compared: dflash never came up in this run" in out

    shown = _first_screen(page, tmp_path)
    screenshot(page, ROOT / "reports" / "html-report-first-screen.png", timeout_s=120)
    assert shown["data-first-before-env"] == "true", "the verdict block is above the Environment table"
    assert shown["data-env-hidden"] == "true", "the Environment table starts collapsed"
    assert shown["data-title-colour"] == "rgb(183, 28, 28)", shown["data-title-colour"]
    text = shown["data-first-text"]
    assert text.startswith("FAIL: night fail; 0 of 1 host pass"), text
    assert "gate service,generation: FAILED" in text and "failed: night service: 1 check(s) failed" in text, text
    assert "[flashinfer-sm12x-nvcc]" in text and "remedy:" in text, text
    assert "services.dflash.command --speculative-num-draft-tokens: 8 → 6" in text, text
    assert "→ absent" not in text, text
    assert "not compared: dflash never came up in this run" in text, text
    assert "run the env layer" not in text, text
    assert all(float(c) >= 7.0 for c in shown["data-diagnosis-contrast"].split()), shown["data-diagnosis-contrast"]
    assert shown["data-diagnosis-contrast"], "the failed row's diagnosis box was rendered"
    assert shown["data-cut"] == "", shown["data-cut"]
    assert "(nvcc) its JIT uses is too old" in " ".join(shown["data-svg-text"].split()), shown["data-svg-text"]
