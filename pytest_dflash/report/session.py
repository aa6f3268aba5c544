"""The run's verdicts on the controller: every test report folded in, the run's completeness judged (was it
interrupted? narrowed? did anything fail outside the dflash tests?), the gate and the verdicts applied to the
exit code, verdict files written at session start (as 'interrupted') and end, and the terminal summary."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash import __version__, interrupts
from pytest_dflash.evidence.attach import first_line, skip_message
from pytest_dflash.evidence.bounds import LINE_BYTES, scrub
from pytest_dflash.evidence.redact import redact
from pytest_dflash.report import step_summary
from pytest_dflash.report.verdict import RunStatus, VerdictBuilder, summary_lines
from pytest_dflash.run.stash import BUILDER_KEY, GATE_KEY, REPORTED_KEY, RUN_KEY

FOREIGN_SHOWN = 20  # problems outside the dflash tests listed by name (the count is always exact)


class VerdictCollector:
    """Folds every test report into the host verdicts (controller side; also without xdist), and watches what
    the reports alone would not show: tests collected but never finished, collection errors, crashed workers,
    failures of tests without a dflash fixture, internal errors."""

    def __init__(self, builder: VerdictBuilder) -> None:
        self.builder = builder
        self.expected: dict[str, None] = {}  # collection order (an ordered set)
        self.started: dict[str, None] = {}
        self.finished: set[str] = set()
        self.foreign: list[str] = []
        self.layers: set[str] = set()
        self.suites: set[str] = set()

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.started[nodeid] = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        dflash = False
        for key, value in report.user_properties:
            if key == "dflash" and isinstance(value, dict):
                dflash = True
                self.layers.add(str(value.get("layer", "")))
                self.builder.add(report.nodeid, report.when, report.outcome, value, _message(report))
        if report.when == "teardown":
            self.finished.add(report.nodeid)
        if report.failed and not dflash:
            line = redact(first_line(report.longreprtext, report.longrepr))
            self.foreign.append(f"{report.nodeid} ({report.when}): {line}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.foreign.append(f"collection error in {report.nodeid or '.'}: "
                                f"{redact(first_line(str(report.longrepr), report.longrepr))}")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._expect(item.nodeid for item in session.items)
        self.suites.update(suite_of(Path(str(item.path))) or "" for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._expect(ids)  # under xdist the controller collects nothing itself: each worker reports its ids
        self.suites.update(suite_of(Path(i.split("::", 1)[0])) or "" for i in ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        if error:
            self.foreign.append(f"xdist worker {getattr(node, 'gateway', node)!s} crashed: "
                                f"{redact(str(error).strip().splitlines()[-1][:300] if str(error).strip() else '?')}")

    def pytest_internalerror(self, excrepr: Any, excinfo: Any) -> None:
        self.foreign.append(f"internal error: {redact(str(excrepr).strip().splitlines()[-1][:300])}")

    def _expect(self, ids: Any) -> None:
        self.expected.update(dict.fromkeys(ids))

    def status(self, session: pytest.Session) -> RunStatus:
        """Judge the run's completeness at session end."""
        config = session.config
        interrupted = None
        missing = [nodeid for nodeid in self.expected if nodeid not in self.finished]
        running = [nodeid for nodeid in self.started if nodeid not in self.finished]
        if session.exitstatus == pytest.ExitCode.INTERRUPTED:
            interrupted = "interrupted (Ctrl-C / SIGTERM / pytest.exit)"
        elif interrupts.in_teardown():
            interrupted = (f"interrupted: {interrupts.received()} arrived while the run stopped what it started "
                           "(that teardown was finished first)")
        elif interrupts.lost():
            interrupted = (f"interrupted: {interrupts.received()} was received, but its KeyboardInterrupt was lost "
                           "(raised inside a finalizer) and the run went on")
        elif session.shouldstop:
            interrupted = f"stopped early: {session.shouldstop}"
        elif session.shouldfail:
            interrupted = f"stopped early: {session.shouldfail}"
        if missing:
            where = f"in progress: {', '.join(running[:3])}" if running else f"first not run: {missing[0]}"
            what = f"{len(missing)} of {len(self.expected)} collected tests never finished ({where})"
            interrupted = f"{interrupted}; {what}" if interrupted else what
        available = available_suites(self.suites - {""}, config)
        suites = (self.suites - {""}) | pyargs_suites(config, available)
        partial = narrowed_by(config, suites, available | suites)
        foreign = list(self.foreign[:FOREIGN_SHOWN])
        if len(self.foreign) > FOREIGN_SHOWN:
            foreign.append(f"… and {len(self.foreign) - FOREIGN_SHOWN} more")
        selection = {
            "args": [redact(str(a)) for a in config.invocation_params.args],
            "plugin_version": __version__,
            "layers": sorted(layer for layer in self.layers if layer),
            "suites": sorted(suites),
            "collected": len(self.expected),
            "finished": len(self.expected.keys() & self.finished),
        }
        return RunStatus(interrupted=interrupted, partial=tuple(partial), foreign=tuple(foreign),
                         selection=selection)


def _message(report: pytest.TestReport) -> str:
    """The one line the verdict says about a test: redacted and capped here too (a report from an older
    worker, or one the plugin never annotated, may carry anything)."""
    if report.skipped:
        text = skip_message(report)
    elif report.failed:
        diagnosis = (body for title, body in report.sections if title.endswith("dflash diagnosis") and body)
        text = next((body.splitlines()[0] for body in diagnosis), None) or first_line(report.longreprtext,
                                                                                     report.longrepr)
    else:
        return ""
    return scrub(text, LINE_BYTES, "verdict message")


def suite_of(path: Path) -> str | None:
    """'smoke' for .../suites/smoke/test_smoke.py (the installed pytest_dflash/suites too); None elsewhere."""
    parts = path.parts
    for index in range(len(parts) - 2, 0, -1):
        if parts[index - 1] == "suites":
            return parts[index]
    return None


def installed_suites_root() -> Path | None:
    """Where `pytest_dflash.suites` lives (a wheel's site-packages, or the clone's suites/ when editable)."""
    try:
        spec = importlib.util.find_spec("pytest_dflash.suites")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def pyargs_suites(config: pytest.Config, available: set[str]) -> set[str]:
    """The suites a --pyargs run names (pytest_dflash.suites.smoke -> smoke; pytest_dflash.suites -> all): its
    node ids are relative to the package, so they do not say."""
    if not getattr(config.option, "pyargs", False):
        return set()
    named: set[str] = set()
    for arg in config.invocation_params.args:
        parts = str(arg).split("::", 1)[0].split(".")
        if parts[:2] == ["pytest_dflash", "suites"]:
            named |= {parts[2]} if len(parts) > 2 else set(available)
    return named


def available_suites(seen: set[str], config: pytest.Config) -> set[str]:
    """The suites that exist beside the ones this run collected (folders of test files under suites/)."""
    roots = {Path(str(config.invocation_params.dir)) / "suites"}
    installed = installed_suites_root()
    if installed is not None and getattr(config.option, "pyargs", False):
        roots.add(installed)
    for arg in config.invocation_params.args:
        path = Path(str(arg).split("::", 1)[0])
        for candidate in (path, *path.parents):
            if candidate.name == "suites":
                roots.add(candidate if candidate.is_absolute() else Path(str(config.invocation_params.dir)) / candidate)
    found = set()
    for root in roots:
        if root.is_dir():
            found |= {child.name for child in root.iterdir() if child.is_dir() and any(child.glob("test_*.py"))}
    return found | seen


def narrowed_by(config: pytest.Config, suites: set[str], available: set[str]) -> list[str]:
    """How the run was narrowed below a whole suite, in words (empty: a whole run)."""
    reasons = []
    option = config.option
    if getattr(option, "keyword", ""):
        reasons.append(f"-k {option.keyword!r}")
    if getattr(option, "markexpr", ""):
        reasons.append(f"-m {option.markexpr!r}")
    lastfailed = getattr(config.pluginmanager.get_plugin("lfplugin"), "lastfailed", None)
    if getattr(option, "lf", False) and lastfailed:  # with nothing failed before, --lf runs everything
        reasons.append("--lf")
    if getattr(option, "deselect", None):
        reasons.append(f"--deselect ({len(option.deselect)})")
    named = [str(a) for a in config.invocation_params.args if "::" in str(a)]
    if named:
        reasons.append(f"selected by node id ({len(named)})")
    # smoke is a designed slice through every layer; anything else short of every suite is a subset
    if suites and "smoke" not in suites and available and not (available - {"smoke"}) <= suites:
        reasons.append(f"a subset of the suites ({', '.join(sorted(suites))} of {', '.join(sorted(available))})")
    return reasons


def start(session: pytest.Session) -> None:
    """Controller, session start: every host's verdict file says 'interrupted' until the run ends."""
    config = session.config
    run = config.stash[RUN_KEY]
    builder = config.stash[BUILDER_KEY]
    builder.status = RunStatus(selection={"args": [redact(str(a)) for a in config.invocation_params.args],
                                          "plugin_version": __version__})
    try:
        builder.write_started(run.options.report_dir, run.profiles)
    except OSError as exc:
        raise pytest.UsageError(f"--dflash-report {run.options.report_dir}: cannot write verdicts: {exc}") from None


def finish(session: pytest.Session, collector: VerdictCollector) -> None:
    """Controller, session end: judge completeness, apply the gate and the verdicts to the exit status, and
    write the verdict files. The exit status is never 0 for a run whose verdicts say fail or interrupted."""
    config = session.config
    run = config.stash[RUN_KEY]
    builder = config.stash[BUILDER_KEY]
    builder.status = collector.status(session)
    gate_layers = config.stash.get(GATE_KEY, [])
    gate = builder.gate(gate_layers) if gate_layers else None
    if gate is not None and session.exitstatus in (0, 1):
        session.exitstatus = 0 if gate["passed"] else 1
    elif gate is None and session.exitstatus == 0 and builder.failing():
        session.exitstatus = 1  # e.g. a host whose tests were all skipped as blocked
    if session.exitstatus == 0 and builder.status.interrupted:
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    if interrupts.lost() and session.exitstatus in (0, 1):
        session.exitstatus = pytest.ExitCode.INTERRUPTED  # what it failed on came after the interrupt
    paths = builder.write(run.options.report_dir, exit_code=int(session.exitstatus), gate=gate)
    step_summary.append(config, builder, gate)  # $GITHUB_STEP_SUMMARY, when set
    config.stash[REPORTED_KEY] = [str(p) for p in paths]


def terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    builder = config.stash[BUILDER_KEY]
    terminalreporter.section("dflash verdict")
    for line in summary_lines(builder):
        terminalreporter.write_line(line)
    gate_layers = config.stash.get(GATE_KEY, [])
    if gate_layers:
        gate = builder.gate(gate_layers)
        terminalreporter.write_line(f"gate {','.join(gate_layers)}: {'PASSED' if gate['passed'] else 'FAILED'}")
        for reason in gate["refused"]:
            terminalreporter.write_line(f"  gate refused: {reason}")
    for path in config.stash.get(REPORTED_KEY, []):
        terminalreporter.write_line(f"verdict: {path}")
