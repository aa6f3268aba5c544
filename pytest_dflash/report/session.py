"""The run's verdicts on the controller: every test report folded in, the run's completeness judged (was it
interrupted? narrowed? did anything fail outside the dflash tests?), the gate and the verdicts applied to the
exit code, verdict files written at session start (as 'interrupted') and end, and the terminal summary."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash import __version__, interrupts
from pytest_dflash.config import options
from pytest_dflash.config.targets import NAMED_HOSTS_KEY, TARGETS_KEY, load_targets, named_despite_errors
from pytest_dflash.evidence.attach import first_line, skip_message
from pytest_dflash.report import checklist, step_summary
from pytest_dflash.report.gate import gate_line, why_lines
from pytest_dflash.report.scope import declared_scope, narrowed_by, suite_of
from pytest_dflash.report.verdict import (
    BUILDER_KEY,
    HostStatus,
    RunStatus,
    VerdictBuilder,
    summary_lines,
)
from pytest_dflash.run import raised
from pytest_dflash.run.collection import item_info
from pytest_dflash.run.stash import GATE_KEY, REPORTED_KEY, RUN_KEY
from pytest_dflash.scrub.bounds import LINE_BYTES, scrub
from pytest_dflash.scrub.redact import redact

FOREIGN_SHOWN = 20  # problems outside the dflash tests listed by name (the count is always exact)


# an xdist worker's Selection, sent to the controller in its workeroutput
SELECTION_OUTPUT = "dflash_selection"


@dataclass
class Selection:
    """What collection did with the tests of each host: `selected` node id -> host (the final items, after
    every deselection), `deselected` host -> node ids taken out after collection, by whatever means."""

    selected: dict[str, str] = field(default_factory=dict)
    deselected: dict[str, list[str]] = field(default_factory=dict)
    # host -> checks its suites define that collection made no test of for it (report/checklist.py), and why
    uncollected: dict[str, list[str]] = field(default_factory=dict)
    uncollected_why: str = ""
    # host -> the layers of the tests collection made for it (before any deselection): what the scope defines
    layers: dict[str, list[str]] = field(default_factory=dict)

    def as_output(self) -> dict[str, Any]:
        return {"selected": dict(self.selected),
                "deselected": {h: list(ids) for h, ids in self.deselected.items()},
                "uncollected": {h: list(ids) for h, ids in self.uncollected.items()},
                "uncollected_why": self.uncollected_why,
                "layers": {h: list(layers) for h, layers in self.layers.items()}}

    def merge(self, output: Any) -> None:
        """Fold in a worker's `as_output()` (every worker collects the same tests: a union, not a sum)."""
        if not isinstance(output, dict):
            return
        self.selected.update({str(k): str(v) for k, v in (output.get("selected") or {}).items()})
        for key in ("deselected", "uncollected", "layers"):
            for host, ids in (output.get(key) or {}).items():
                known = getattr(self, key).setdefault(str(host), [])
                known += [str(i) for i in ids if str(i) not in known]
        self.uncollected_why = self.uncollected_why or str(output.get("uncollected_why") or "")


SELECTION_KEY = pytest.StashKey[Selection]()


class SelectionRecorder:
    """Where the tests are collected (the only process without xdist; each xdist worker): records which tests
    of which host survived collection, and counts what was deselected by ANY means — -k, -m, --lf, --sw,
    --deselect, a conftest or another plugin that drops items in pytest_collection_modifyitems, or calls
    pytest_deselected — by comparing the items before and after every modifyitems hook."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.dropped: dict[int, pytest.Item] = {}
        self.raw: dict[int, pytest.Item] = {}  # every item a collector made, before any plugin filtered it
        self.modules: dict[Path, str] = {}  # every module collected (path -> node id)
        self.module_paths: set[Path] = set()  # and those whose collection failed (a collection error)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Generator[None, Any, Any]:
        """Innermost: what the collector really produced. A plugin that filters a collect report (--lf drops a
        file's passed tests there) never calls pytest_deselected; what it dropped counts all the same."""
        report = yield
        self.raw.update({id(node): node for node in report.result or () if isinstance(node, pytest.Item)})
        if isinstance(collector, pytest.Module):
            path = Path(str(collector.path)).resolve()
            self.module_paths.add(path)
            if report.passed:
                self.modules[path] = collector.nodeid
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> Generator[None, None, None]:
        before = list(items)
        yield
        kept = {id(item) for item in items}
        self.dropped.update({id(item): item for item in before if id(item) not in kept})

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self.dropped.update({id(item): item for item in items})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        selection = Selection()
        final = {id(item) for item in session.items}
        self.dropped.update({key: item for key, item in self.raw.items() if key not in final})
        for item in session.items:
            if (info := item_info(item)) is not None:
                selection.selected[item.nodeid] = info.host
        for key, item in self.dropped.items():
            if key not in final and (info := item_info(item)) is not None:
                selection.deselected.setdefault(info.host, []).append(item.nodeid)
        for item in (*self.raw.values(), *session.items):
            info = item_info(item)
            if info is not None and info.layer not in selection.layers.get(info.host, []):
                selection.layers.setdefault(info.host, []).append(info.layer)
        self._checklist(selection)
        self.config.stash[SELECTION_KEY] = selection
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[SELECTION_OUTPUT] = selection.as_output()


    def _checklist(self, selection: Selection) -> None:
        """The checks of the suites (and of every module with a dflash test) that collection made no test of,
        per host (report/checklist.py)."""
        run = self.config.stash.get(RUN_KEY, None)
        if run is None or not run.profiles:
            return
        dflash_modules = {Path(str(item.path)).resolve() for item in self.raw.values()
                          if item_info(item) is not None}
        modules = {path: nodeid for path, nodeid in self.modules.items()
                   if suite_of(path) is not None or path in dflash_modules}
        invocation = self.config.invocation_params
        files = checklist.suite_files(invocation.args, Path(str(invocation.dir)),
                                      pyargs=bool(getattr(self.config.option, "pyargs", False)))
        selection.uncollected = checklist.uncollected(modules, files - self.module_paths, self.raw.values(),
                                                      list(run.profiles), self.config.rootpath)
        copied = checklist.copies_without(modules)
        for host in (run.profiles if copied else ()):
            selection.uncollected[host] = [*copied, *selection.uncollected.get(host, [])]
        if selection.uncollected:
            selection.uncollected_why = checklist.why_uncollected(self.config, copies=bool(copied))


class VerdictCollector:
    """Folds every test report into the host verdicts (controller side; also without xdist), and watches what
    the reports alone would not show: tests selected but never finished (per host), tests deselected,
    collection errors, crashed workers, internal errors and failures of tests without a dflash fixture."""

    def __init__(self, config: pytest.Config, builder: VerdictBuilder) -> None:
        self.config = config
        self.builder = builder
        self.expected: dict[str, None] = {}  # collection order (an ordered set)
        self.started: dict[str, None] = {}
        self.finished: set[str] = set()
        self.foreign: list[str] = []
        # what makes the whole run not whole: crashes, collection / internal errors
        self.broken: list[str] = []
        self.worker_selection = Selection()
        self.layers: set[str] = set()
        self.suites: set[str] = set()

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.started[nodeid] = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        dflash = False
        outcome, message = counted(report)
        for key, value in report.user_properties:
            if key == "dflash" and isinstance(value, dict):
                dflash = True
                self.layers.add(str(value.get("layer", "")))
                self.builder.add(report.nodeid, report.when, outcome, value, message)
        if report.when == "teardown":
            self.finished.add(report.nodeid)
        if outcome == "failed" and not dflash and report.when in ("setup", "call", "teardown"):
            line = redact(message or first_line(report.longreprtext, report.longrepr))
            self.foreign.append(f"{report.nodeid} ({report.when}): {line}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.broken.append(f"collection error in {report.nodeid or '.'}: "
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
        self.worker_selection.merge((getattr(node, "workeroutput", None) or {}).get(SELECTION_OUTPUT))
        if error:
            last = str(error).strip().splitlines()[-1][:300] if str(error).strip() else "?"
            self.broken.append(f"xdist worker {_worker(node)} crashed: {redact(last)}")

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        self.broken.append(f"an xdist worker crashed while running {crashitem} (an infrastructure failure: "
                           "the run is not whole, even where xdist ran the rest of its tests on another "
                           "worker)")

    def pytest_internalerror(self, excrepr: Any, excinfo: Any) -> None:
        self.broken.append(f"internal error: {redact(str(excrepr).strip().splitlines()[-1][:300])}")

    def _expect(self, ids: Any) -> None:
        self.expected.update(dict.fromkeys(ids))

    def selection(self) -> Selection | None:
        """Each host's selected and deselected tests: this process's own collection, or the workers' (None
        when no worker lived to send its own: then only the run as a whole can be judged)."""
        own = self.config.stash.get(SELECTION_KEY, None)
        if own is not None:
            return own
        return (self.worker_selection if self.worker_selection.selected or self.worker_selection.deselected
                else None)

    def status(self, session: pytest.Session) -> RunStatus:
        """Judge the run's completeness at session end: the run's own, then each host's."""
        config = session.config
        run = config.stash[RUN_KEY]
        reasons = []
        running = [nodeid for nodeid in self.started if nodeid not in self.finished]
        if interrupts.in_teardown():
            reasons.append(f"interrupted: {interrupts.received()} arrived while the run stopped what it "
                           "started (that teardown was finished first)")
        elif interrupts.lost():
            reasons.append(f"interrupted: {interrupts.received()} was received, but its KeyboardInterrupt "
                           "was lost (raised inside a finalizer) and the run went on")
        if session.shouldstop:
            reasons.append(f"stopped early: {session.shouldstop}")
        elif session.shouldfail:
            reasons.append(f"stopped early: {session.shouldfail}")
        exit_reason = _EXIT_REASONS.get(int(session.exitstatus))
        if exit_reason and not (reasons and session.exitstatus == pytest.ExitCode.INTERRUPTED):
            reasons.insert(0, exit_reason)
        reasons += self.broken[:FOREIGN_SHOWN]
        if len(self.broken) > FOREIGN_SHOWN:
            reasons.append(f"… and {len(self.broken) - FOREIGN_SHOWN} more")
        selection = self.selection()
        hosts: dict[str, HostStatus] = {}
        for name in run.profiles:
            ids = [nodeid for nodeid, host in (selection.selected.items() if selection else ())
                   if host == name]
            lost = tuple(nodeid for nodeid in ids if nodeid not in self.finished)
            uncollected = tuple(selection.uncollected.get(name, ())) if selection else ()
            hosts[name] = HostStatus(selected=len(ids), finished=len(ids) - len(lost), lost=lost,
                                     deselected=len(selection.deselected.get(name, ())) if selection else 0,
                                     uncollected=uncollected,
                                     uncollected_why=selection.uncollected_why if selection else "",
                                     layers=tuple(selection.layers.get(name, ())) if selection else ())
        attributed = set(selection.selected) if selection else set()
        missing = [nodeid for nodeid in self.expected
                   if nodeid not in self.finished and nodeid not in attributed]
        if missing:
            where = f"in progress: {', '.join(running[:3])}" if running else f"first not run: {missing[0]}"
            reasons.append(f"{len(missing)} of {len(self.expected)} collected tests never finished ({where})")
        if selection is None and self.expected and any(run.profiles):
            reasons.append("no process that collected the tests reported which host each one belongs to")
        scope = declared_scope(config, self.suites - {""})
        partial = narrowed_by(config)
        foreign = list(self.foreign[:FOREIGN_SHOWN])
        if len(self.foreign) > FOREIGN_SHOWN:
            foreign.append(f"… and {len(self.foreign) - FOREIGN_SHOWN} more")
        selection_facts = {
            **_selection_args(config),
            "layers": sorted(layer for layer in self.layers if layer),
            "suites": list(scope.suites),
            "collected": len(self.expected),
            "finished": len(self.expected.keys() & self.finished),
        }
        return RunStatus(interrupted="; ".join(reasons) or None, partial=tuple(partial),
                         foreign=tuple(foreign), selection=selection_facts, hosts=hosts,
                         named_hosts=self.builder.status.named_hosts, shard=self.builder.status.shard,
                         scope=scope)


# pytest's own exit codes that say the run as a whole did not work (1 is a test's business; 0 needs no reason)
_EXIT_REASONS = {
    int(pytest.ExitCode.INTERRUPTED): "interrupted (Ctrl-C / SIGTERM / pytest.exit)",
    int(pytest.ExitCode.INTERNAL_ERROR): "internal error (exit 3)",
    int(pytest.ExitCode.USAGE_ERROR): "usage error (exit 4)",
    int(pytest.ExitCode.NO_TESTS_COLLECTED): "no tests were collected (exit 5)",
}


def _worker(node: Any) -> str:
    return str(getattr(getattr(node, "gateway", None), "id", None) or node)


# the outcome pytest-rerunfailures gives the report of an attempt that failed and is run again
RERUN = "rerun"


def counted(report: pytest.TestReport) -> tuple[str, str]:
    """The outcome the verdict counts for a report, and its one line: a failure stays a failure under an xfail
    marker (added by a conftest or a plugin onto a check: xfailed, or not run at all with run=False) and
    under a rerun that then passed (pytest-rerunfailures: a flaky check is no pass), and a report some plugin
    rewrote into a pass although the check raised (run/raised.py); an xpass that is not strict counts as the
    pass it is."""
    forged = raised.forged_pass(report)
    if forged is not None:
        return "failed", _capped(f"reported as a pass by a plugin, but the check raised {forged}")
    if report.outcome == RERUN:
        return "failed", _capped(f"flaky: failed, then run again: {_failure_line(report)}")
    if report.skipped and hasattr(report, "wasxfail"):
        return "failed", _capped(f"xfail-marked: {_failure_line(report)}")
    return report.outcome, _message(report)


def _message(report: pytest.TestReport) -> str:
    """The one line the verdict says about a test: redacted and capped here too (a report from an older
    worker, or one the plugin never annotated, may carry anything)."""
    if report.skipped:
        return _capped(skip_message(report))
    if report.failed:
        return _capped(_failure_line(report))
    return ""


def _failure_line(report: pytest.TestReport) -> str:
    diagnosis = (body for title, body in report.sections if title.endswith("dflash diagnosis") and body)
    return next((body.splitlines()[0] for body in diagnosis), None) or first_line(report.longreprtext,
                                                                                 report.longrepr)


def _capped(text: str) -> str:
    return scrub(text, LINE_BYTES, "verdict message")


def writes_verdicts(config: pytest.Config) -> bool:
    """The controller of a run that runs tests (not an xdist worker, not --collect-only: a listing must leave
    the hosts' last verdicts as they were)."""
    return not hasattr(config, "workerinput") and not config.getoption("collectonly", False)


def start(config: pytest.Config, builder: VerdictBuilder, report_dir: Path,
          profiles: Mapping[str, Any]) -> None:
    """Controller, in pytest_configure before anything can block or fail (discovery of attached servers,
    readiness, collection): every host the run names gets a verdict file that says 'interrupted' until the run
    ends, so a run killed at any phase never leaves an older 'pass' standing."""
    named = config.stash.get(NAMED_HOSTS_KEY, tuple(profiles))
    shard = str(options.option(config, "dflash_shard") or "") or None
    builder.status = RunStatus(selection=_selection_args(config), named_hosts=tuple(named), shard=shard)
    builder.name_hosts(profiles)
    try:
        builder.write_started(report_dir, profiles)
    except OSError as exc:
        raise pytest.UsageError(f"--dflash-report {report_dir}: cannot write verdicts: {exc}") from None


def refuse(config: pytest.Config, builder: VerdictBuilder, report_dir: Path, hosts: Sequence[str],
           error: BaseException) -> None:
    """A usage error ends the run before any test: each host it names gets an 'interrupted' verdict naming the
    error (best effort: a folder that cannot be written is the user's next error, not this one's)."""
    if not builder.status.selection:
        builder.status = RunStatus(selection=_selection_args(config), named_hosts=tuple(hosts))
    reason = f"the run ended with a usage error before any test ran: {redact(str(error).strip())[:500]}"
    with contextlib.suppress(OSError):
        builder.write_started(report_dir, hosts, reason=reason)


def leave_no_pass(config: pytest.Config, reason: str) -> None:
    """After an internal error, wherever it came from: each host the options name gets an 'interrupted'
    verdict naming it (best effort: this runs while pytest reports the error), never an older or this run's
    `pass`."""
    if not writes_verdicts(config):
        return
    builder = config.stash.get(BUILDER_KEY, None) or VerdictBuilder(uuid.uuid4().hex[:12])
    try:
        profiles = config.stash.get(TARGETS_KEY, None)
        hosts = list(profiles if profiles is not None else load_targets(config))
    except Exception:
        hosts = []
    with contextlib.suppress(Exception):
        hosts = hosts or named_despite_errors(config)
        if not builder.status.selection:
            builder.status = RunStatus(selection=_selection_args(config), named_hosts=tuple(hosts))
        builder.write_started(options.report_dir(config), hosts, reason=redact(reason.strip())[:500])


def _selection_args(config: pytest.Config) -> dict[str, Any]:
    return {"args": [redact(str(a)) for a in config.invocation_params.args], "plugin_version": __version__}


def finish(session: pytest.Session, collector: VerdictCollector) -> None:
    """Controller, session end: judge completeness, apply the gate and the verdicts to the exit status, and
    write the verdict files. The exit status is never 0 for a run whose verdicts say fail or interrupted."""
    config = session.config
    run = config.stash[RUN_KEY]
    builder = config.stash[BUILDER_KEY]
    builder.status = collector.status(session)
    gate_layers = config.stash.get(GATE_KEY, [])
    gate = builder.gate(gate_layers) if gate_layers else None
    verdicts = {verdict.final_verdict(builder.status) for verdict in builder.hosts.values()}
    if gate is not None and session.exitstatus in (0, 1):
        session.exitstatus = 0 if gate["passed"] else 1
    if session.exitstatus == 0 and "interrupted" in verdicts:
        # e.g. a crashed worker whose tests ran again elsewhere
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    elif session.exitstatus == 0 and gate is None and "fail" in verdicts:
        session.exitstatus = 1  # e.g. a host whose tests were all skipped as blocked
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
        terminalreporter.write_line(gate_line(gate))
        for line in why_lines(gate):
            terminalreporter.write_line(line)
    for path in config.stash.get(REPORTED_KEY, []):
        terminalreporter.write_line(f"verdict: {path}")


def finish_empty_shard(session: pytest.Session) -> None:
    """A shard that holds none of the fleet's hosts tested nothing. Without --gate that is no failure (a CI
    matrix wider than its fleet has such shards; the merge of every shard is the fleet's verdict, and it fails
    on a named host without a verdict): exit 0, said in words. With --gate it is: a gate over no host never
    opens (exit 1)."""
    if session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        return  # something else of the run (a test of its own, a usage error) already said what it is
    gated = bool(session.config.stash.get(GATE_KEY, []))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED if gated else pytest.ExitCode.OK


def empty_shard_summary(terminalreporter: Any, config: pytest.Config, line: str) -> None:
    terminalreporter.section("dflash verdict")
    terminalreporter.write_line(line)
    gate_layers = config.stash.get(GATE_KEY, [])
    if gate_layers:
        terminalreporter.write_line(f"gate {','.join(gate_layers)}: FAILED: this shard holds no host, and a "
                                    "gate over no host never opens")
