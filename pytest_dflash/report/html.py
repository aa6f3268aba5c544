"""pytest-html integration: the diagnosis as a highlighted extra in each failed row, and the
host x layer verdict table at the top of the report. (The journal tails already appear in each
row's log block, because they are report sections.) Registered only when pytest-html is active."""

from __future__ import annotations

import html
from collections.abc import Generator
from typing import Any

import pytest

from pytest_dflash.run.layers import LAYERS

COLOURS = {"passed": "#2e7d32", "failed": "#c62828", "blocked": "#ef6c00", "skipped": "#757575",
           "not-run": "#bdbdbd"}


class HtmlHooks:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report: pytest.TestReport = yield
        if not report.failed:
            return report
        from pytest_html import extras

        for title, body in report.sections:
            if title == "dflash diagnosis":
                box = (f'<div style="border-left:4px solid #c62828;padding:6px 10px;background:#fff3f3">'
                       f"<b>dflash diagnosis</b><pre style=\"white-space:pre-wrap\">{html.escape(body)}</pre></div>")
                report.extras = [*getattr(report, "extras", []), extras.html(box)]  # type: ignore[attr-defined]
        return report

    def pytest_html_results_summary(self, prefix: list[str], summary: list[str], postfix: list[str]) -> None:
        from pytest_dflash.run.stash import BUILDER_KEY

        builder = self.config.stash.get(BUILDER_KEY, None)
        if builder is None or not builder.hosts:
            return
        head = "".join(f"<th>{layer}</th>" for layer in LAYERS)
        rows = []
        for name, verdict in sorted(builder.hosts.items()):
            cells = "".join(
                f'<td style="color:{COLOURS[outcome]};font-weight:bold">{outcome}</td>'
                for outcome in verdict.layer_outcomes().values()
            )
            colour = COLOURS["passed" if verdict.verdict == "pass" else "failed"]
            rows.append(f'<tr><td>{html.escape(name)}</td><td style="color:{colour}"><b>{verdict.verdict.upper()}'
                        f"</b></td>{cells}</tr>")
            for failure in verdict.failures:
                diagnosis = "; ".join(f"[{d['id']}] {d['title']}" for d in failure.get("diagnosis", [])[:2])
                rows.append(f'<tr><td></td><td colspan="{len(LAYERS) + 1}">FAILED {html.escape(failure["test"])}: '
                            f"{html.escape(diagnosis or failure['message'])}</td></tr>")
        style = ("<style>table.dflash-verdict{border-collapse:collapse;margin-bottom:1em}"
                 "table.dflash-verdict th,table.dflash-verdict td{border:1px solid #ddd;padding:3px 8px;"
                 "text-align:left}</style>")
        prefix.append(f'{style}<h2>dflash verdict</h2><table class="dflash-verdict"><tr><th>host</th><th>verdict</th>'
                      f"{head}</tr>{''.join(rows)}</table>")
