"""pytest hooks of the perf layer: its configuration, the `dflash_perf` fixture, and each test's
report section.

Registered through pytest_dflash.plugin.pytest_plugins. Every option is also an ini key (dflash_ prefix).

    pytest --host local suites/perf
    pytest --host ct200 suites/perf --update-baseline          # record this (good) run as the baseline
    pytest --host ct200 suites/perf --perf-requests 800 --html reports/perf.html

    options    options.py    the fixture's object (PerfLayer)    layer.py     the run records   service_run.py
    runs       book.py       report sections, terminal summary   report.py    judging           judging.py
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_dflash.layers.perf.book import PerfBook, PerfItem
from pytest_dflash.layers.perf.layer import PerfLayer
from pytest_dflash.layers.perf.options import PerfOptions, options_from_config
from pytest_dflash.layers.perf.report import PerfSummary, html_block, runs_table, section_text

OPTIONS_KEY = pytest.StashKey[PerfOptions]()
BOOK_KEY = pytest.StashKey[PerfBook]()
ITEM_KEY = pytest.StashKey[PerfItem]()


def pytest_configure(config: pytest.Config) -> None:
    perf_options = options_from_config(config)
    config.stash[OPTIONS_KEY] = perf_options
    config.stash[BOOK_KEY] = PerfBook(config, perf_options)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(PerfSummary(), "dflash-perf-summary")


@pytest.fixture
def dflash_perf(request: pytest.FixtureRequest) -> PerfLayer:
    """The perf layer: `dflash_perf.floors_of(dflash_service)`, `.measure(...)`, `.check(run, judgements)`."""
    item = request.node.stash.setdefault(ITEM_KEY, PerfItem())
    node = request.node if isinstance(request.node, pytest.Item) else None
    return PerfLayer(request.config.stash[BOOK_KEY], item, node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    perf = item.stash.get(ITEM_KEY, None)
    if perf is not None and report.when == "call" and perf.sweep_lines:  # a sweep test: its curve
        report.sections.append(("dflash sweep", "\n".join(perf.sweep_lines)))
        report.user_properties.append(("dflash_sweep", list(perf.sweep_lines)))  # the terminal summary's
        item.user_properties.extend(perf.properties)
    if perf is None or report.when != "call" or not perf.runs:
        return report
    report.sections.append(("dflash perf", section_text(perf.runs, perf.judgements)))
    report.user_properties.append(("dflash_perf", [run.summary() for run in perf.runs]))
    for run in perf.runs:  # flat, so JUnit carries the numbers themselves; junitxml reads the teardown
        item.user_properties.extend(run.junit_properties())  # report's properties: the item's reach it
    if item.config.pluginmanager.hasplugin("html"):
        from pytest_html import extras

        blocks = [runs_table(perf.runs)] + [html_block(run, plots=run in perf.measured) for run in perf.runs]
        report.extras = [*getattr(report, "extras", []),  # type: ignore[attr-defined]
                         extras.html("".join(blocks))]
    return report
