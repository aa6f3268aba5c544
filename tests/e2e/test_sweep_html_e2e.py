"""`pytest --host H suites/perf -k test_crossover --html=…` against real refservers with a load sweep: the HTML
report carries the host's sweep in pictures (output tok/s with bounds, TTFT / TPOT p99 over the SLO band, the
speed-up with its 1x line and the crossover labelled), and a real browser shows them with legible text.

The refservers charge the tokens a pass verifies (--gpu-token-us 1100 over 8 ms steps, DFLASH block 8): DFLASH
is ~1.4x NONE at concurrency 1 and ~0.6x at 8, so the crossover is at 8 (tests/e2e/test_sweep_e2e.py gates
on it; here the picture must say what sweep.json says). One run, shared by every check (~20 s)."""

from __future__ import annotations

import re
from pathlib import Path

from e2e_helpers import ROOT
from support.browser import measured_body, screenshot
from support.pytest_runs import assert_no_crash

from pytest_dflash.load.curve import SweepCurve

PROFILE = """
[host]
connection = "local://"
python = "auto"
provision = "always"

[services.none]
kind = "process"
algorithm = "NONE"
command = ["{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
           "--speculative-algorithm", "NONE", "--gpu-step-ms", "8", "--gpu-token-us", "1100"]
ready_timeout = "60s"

[services.dflash]
kind = "process"
algorithm = "DFLASH"
command = ["{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
           "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8", "--gpu-step-ms", "8",
           "--gpu-token-us", "1100"]
ready_timeout = "60s"

[perf]
endpoint = "generate"
prompt_len = 8
output_len = 8
max_loop_lag_ms = 500      # the client shares two cores with the servers
max_client_cpu = 1.0
sweep = [1, 8]
sweep_budget = "2m"

[slo]
ttft_p99_ms = 400        # loose enough that no level is measured twice: the run stays short
tpot_p99_ms = 150

[floors.dflash]
crossover_vs = "none"
speedup_up_to = 1
"""

# Appended to a copy of the report: after its scripts ran, the contrast of every text of the sweep section
# (HTML text by its colour, SVG text by its fill, each over the first opaque background behind it) and the
# number of pictures drawn, as <body> attributes.
MEASURE = """<script>window.addEventListener('load', function () {
  function rgb(c) { return (c.match(/[0-9.]+/g) || []).slice(0, 3).map(Number); }
  function lum(c) { return rgb(c).map(function (v) { v /= 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); })
    .reduce(function (a, v, i) { return a + v * [0.2126, 0.7152, 0.0722][i]; }, 0); }
  function background(el) { var b = 'rgba(0, 0, 0, 0)';
    while (el && (b = getComputedStyle(el).backgroundColor) === 'rgba(0, 0, 0, 0)') el = el.parentElement;
    return el ? b : 'rgb(255, 255, 255)'; }
  function ratio(a, z) { a = lum(a); z = lum(z); return (Math.max(a, z) + 0.05) / (Math.min(a, z) + 0.05); }
  var worst = [];
  document.querySelectorAll('.dflash-sweep li, .dflash-sweep h3').forEach(function (el) {
    worst.push([ratio(getComputedStyle(el).color, background(el)), el.textContent]); });
  document.querySelectorAll('.dflash-sweep svg text').forEach(function (el) {
    worst.push([ratio(getComputedStyle(el).fill, 'rgb(255, 255, 255)'), el.textContent]); });
  worst.sort(function (a, b) { return a[0] - b[0]; });
  var b = document.body;
  b.setAttribute('data-texts', String(worst.length));
  b.setAttribute('data-lowest', worst.length ? worst[0][0].toFixed(2) + ' ' + worst[0][1] : '');
  b.setAttribute('data-svgs', String(document.querySelectorAll('.dflash-sweep svg').length));
});</script>"""



def test_the_html_report_draws_the_sweep_and_marks_the_crossover_the_curve_states(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    profile = tmp_path / "sweepy.toml"
    profile.write_text(PROFILE)
    page = tmp_path / "report.html"
    result = run_suite("perf", "--host", str(profile), "-k", "test_crossover", f"--html={page}",
                       "--self-contained-html")
    assert_no_crash(result)
    curve = SweepCurve.from_json((run_suite.reports / "perf" / "sweepy" / "sweep.json").read_text())
    text = page.read_text()
    # pytest-html keeps the summary's prefix in the page as is; the rows' extras go in its JSON blob
    assert "<h2>dflash load sweep</h2>" in text
    assert text.count('<div class="dflash-sweep" data-host="sweepy">') == 1
    section = text[text.index("<h2>dflash load sweep</h2>"):]
    for title in ("Output tok/s against load — sweepy", "TTFT p99 against load — sweepy",
                  "TPOT p99 against load — sweepy", "Speed-up of dflash over none — sweepy"):
        assert f"<title>{title}</title>" in section, title
    assert section.count('class="dflash-error-bar"') >= 4  # 2 services x 2 levels of tok/s, and the speed-ups
    assert section.count('class="dflash-slo-band"') == 2 and "1× = as fast as none" in section
    speedup = curve.speedup("dflash", "none")
    assert speedup is not None
    if speedup.crossover is not None:  # the picture says what the curve says, whichever it is
        assert f"slower than none from concurrency {speedup.crossover}</text>" in section
        assert f"crossover: {speedup.crossover_text}" in section
    else:
        assert 'class="dflash-no-crossover"' in section
    assert re.search(r'<b style="color:#[0-9a-f]{6}">(pass|fail|inconclusive)</b> dflash: crossover_vs_none',
                     section)

    # what a person sees: every text of the section at >= 7:1, the four pictures drawn
    page_copy = tmp_path / "sweep.html"
    page_copy.write_text(text)
    shown = measured_body(page_copy, MEASURE)
    assert shown["data-svgs"] == "4", shown
    assert int(shown["data-texts"]) > 20, shown
    assert float(shown["data-lowest"].split()[0]) >= 7.0, shown["data-lowest"]
    # the section alone, as a picture for people reading the CI artifacts (reports/ is git-ignored)
    alone = tmp_path / "sweep-section.html"
    alone.write_text('<html><body style="margin:8px;font-family:sans-serif">' + section[
        :section.index("</div></div>") + len("</div></div>")] + "</body></html>")
    screenshot(alone, ROOT / "reports" / "html-report-sweep.png", width=1320, height=900, timeout_s=120)
