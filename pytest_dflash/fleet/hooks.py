"""End-of-run fleet summary and Prometheus export (controller only). Registered through
pytest_dflash.plugin.pytest_plugins.

After the per-host verdicts are written, the same summary `pytest-dflash merge` builds is written for this
run into the report dir (fleet-summary.json/.html, fleet-junit.xml, fleet.prom), with the trend against the
summary that was there before and "what changed" against each host's last good verdict (history/), so a
single-runner nightly needs no merge step.

    pytest --fleet hosts/ suites/smoke -n auto --prometheus /var/lib/node_exporter/textfile/dflash.prom
    pytest --fleet inventory.yml suites/smoke -n 8 --prometheus-push http://pushgateway:9091/metrics/job/nightly
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config import options
from pytest_dflash.config.targets import TARGETS_KEY, file_name
from pytest_dflash.fleet import outputs as fleet_outputs
from pytest_dflash.fleet import prometheus
from pytest_dflash.fleet import summary as fleet_summary
from pytest_dflash.fleet import verdicts as fleet_verdicts
from pytest_dflash.report import session as report_session
from pytest_dflash.run.stash import GATE_KEY, REPORTED_KEY, RUN_KEY

RESULT_KEY = pytest.StashKey[dict[str, Any]]()
# The report dir's fleet-summary.json as the run found it: the trend's baseline at its end (the file itself
# says 'interrupted' from the start, for a run that is killed before it ends)
PREVIOUS_KEY = pytest.StashKey[bytes]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    previous = options.path(config, "dflash_previous_summary")
    if previous is not None and not previous.is_file():
        raise pytest.UsageError(f"--previous-summary / dflash_previous_summary: {previous}: no such file")
    if push_url := _push_url(config):
        try:
            prometheus.check_push_url(push_url)
        except prometheus.PushError as exc:
            raise pytest.UsageError(f"--prometheus-push / dflash_prometheus_push: {exc}") from None
    _retract_passes(config)


def _retract_passes(config: pytest.Config) -> None:
    """A run killed outright (SIGKILL, an OOM kill, a CI timeout's kill -9) never reaches sessionfinish: the
    textfiles would keep the last run's `dflash_host_pass 1`, fleet-summary.json/.html and fleet-junit.xml the
    last run's pass. From the start they say what the verdict files report/started.py wrote say: each host
    this run names is interrupted until the run ends (the old summary is kept in memory as the trend's
    baseline)."""
    profiles = config.stash.get(TARGETS_KEY, None)
    if not profiles or not _enabled(config) or not report_session.writes_verdicts(config):
        return
    report_dir = options.report_dir(config)
    paths = [report_dir / f"{file_name(host)}.verdict.json" for host in profiles]
    try:
        started = [fleet_verdicts.LoadedVerdict(path, fleet_verdicts.read_verdict(path)) for path in paths
                   if path.is_file()]
        summary = fleet_summary.build_summary(started)
        text = prometheus.fleet_exposition(summary)
        old = report_dir / fleet_outputs.SUMMARY_JSON
        files = (fleet_outputs.SUMMARY_JSON, fleet_outputs.SUMMARY_HTML, fleet_outputs.JUNIT_XML)
        if any((report_dir / name).is_file() for name in files):
            if old.is_file():
                config.stash[PREVIOUS_KEY] = old.read_bytes()
            fleet_outputs.write_summary_files(summary, report_dir)
        for textfile in (report_dir / fleet_outputs.PROMETHEUS, options.path(config, "dflash_prometheus")):
            if textfile is not None and textfile.is_file():
                prometheus.write_textfile(textfile, text)
    except (OSError, fleet_verdicts.FleetInputError) as exc:  # the run goes on; its end rewrites them
        config.stash[RESULT_KEY] = {"error": f"the fleet summary and fleet.prom not reset at the start: "
                                             f"{exc}"}


def _push_url(config: pytest.Config) -> str:
    return options.text(config, "dflash_prometheus_push")


def _enabled(config: pytest.Config) -> bool:
    return options.flag(config, "dflash_fleet_summary")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput") or not _enabled(config):
        return
    run = config.stash.get(RUN_KEY, None)
    reported = config.stash.get(REPORTED_KEY, [])
    if run is None or not run.profiles or not reported:
        return
    report_dir: Path = run.options.report_dir
    previous = options.path(config, "dflash_previous_summary")
    kept = config.stash.get(PREVIOUS_KEY, None)
    if previous is None and kept is None and (report_dir / fleet_outputs.SUMMARY_JSON).is_file():
        previous = report_dir / fleet_outputs.SUMMARY_JSON
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dflash-summary-") as scratch:
        if previous is None and kept is not None:  # the summary the run found (its file says interrupted now)
            previous = Path(scratch) / fleet_outputs.SUMMARY_JSON
            previous.write_bytes(kept)
        _summarize(config, run, reported, previous, result)
    if "summary" in result and (push_url := _push_url(config)):
        try:
            result["pushed"] = prometheus.push(push_url, result["summary"])
        except prometheus.PushError as exc:
            result["push_error"] = f"prometheus push failed: {exc}"
    config.stash[RESULT_KEY] = result


def _summarize(config: pytest.Config, run: Any, reported: list[str], previous: Path | None,
               result: dict[str, Any]) -> None:
    report_dir = run.options.report_dir
    try:
        verdicts = [fleet_verdicts.LoadedVerdict(Path(p), fleet_verdicts.read_verdict(Path(p)))
                    for p in reported]
        try:
            if previous is not None:
                fleet_summary.read_summary(previous)
        except fleet_verdicts.FleetInputError as exc:
            result["warning"] = f"previous summary ignored: {exc}"
            previous = None
        gate: list[str] = config.stash.get(GATE_KEY, [])
        summary, outputs = fleet_outputs.summarize(
            verdicts, report_dir, previous_path=previous,
            history_dir=options.path(config, "dflash_history") or report_dir / fleet_verdicts.HISTORY,
            gate_layers=gate, prometheus=options.path(config, "dflash_prometheus"),
            one_shard=bool(options.option(config, "dflash_shard")))
        result.update(summary=summary, outputs=outputs)
    except (OSError, fleet_verdicts.FleetInputError) as exc:
        # The verdicts and the exit code stand; the summary is a view of them.
        result["error"] = f"fleet summary not written: {exc}"


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    result = config.stash.get(RESULT_KEY, None)
    if not result:
        return
    for key in ("warning", "error", "push_error"):
        if key in result:
            terminalreporter.write_line(f"dflash: {result[key]}", red=True)
    summary = result.get("summary")
    if summary is None:
        return
    trend = summary.get("trend")
    not_passing = summary["totals"]["pass"] < summary["totals"]["hosts"]
    interesting = not_passing or (trend and any(trend[k] for k in ("fixed", "disappeared", "perf")))
    if summary["totals"]["hosts"] > 1 or interesting:
        for line in fleet_outputs.headline(summary, gate_line=False):
            terminalreporter.write_line(line)
    terminalreporter.write_line(f"fleet summary: {result['outputs'].summary_html}")
    for path in result["outputs"].prometheus[1:]:
        terminalreporter.write_line(f"prometheus: {path}")
    if "pushed" in result:
        terminalreporter.write_line(f"prometheus push: {result['pushed']}")
