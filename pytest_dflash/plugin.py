"""pytest plugin: the hooks, each delegating to the module that owns the step (like pytest-xdist's plugin.py).

Loaded through the `pytest11` entry point. It does nothing unless a target is given
(`--host`, `--attach` or `--fleet`), so it is safe to have installed in any project.

    options        config/options.py      targets     config/targets.py
    collection     run/collection.py      fixtures    run/fixtures.py (registered below)
    blocking       run/blocking.py        cleanup     run/cleanup.py
    evidence       evidence/attach.py     verdicts    report/session.py, report/verdict.py
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_dflash import interrupts
from pytest_dflash.config import options
from pytest_dflash.config.layers import LAYER_HELP, LAYERS
from pytest_dflash.config.profiles import HostProfile
from pytest_dflash.config.targets import EMPTY_SHARD_KEY, TARGETS_KEY
from pytest_dflash.evidence import attach
from pytest_dflash.fleet import scheduling
from pytest_dflash.report import session as report_session
from pytest_dflash.report.progress import ProgressChannel
from pytest_dflash.report.verdict import BUILDER_KEY
from pytest_dflash.run import cleanup, collection, discovery, preflight, raised, skips, timeouts
from pytest_dflash.run.blocking import blocked_reason
from pytest_dflash.run.collection import INFO_KEY
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.stash import GATE_KEY, REPORTED_KEY, RUN_KEY
from pytest_dflash.run.state import DflashRun

# The fixtures, and the layer modules that add their own options and hooks (pytest loads them with this
# plugin).
pytest_plugins: list[str] = ["pytest_dflash.report.started", "pytest_dflash.run.fixtures",
                              "pytest_dflash.layers.gpu.hooks", "pytest_dflash.fleet.hooks",
                              "pytest_dflash.layers.parity.hooks", "pytest_dflash.layers.perf.hooks"]
# The plugin objects registered below that the verdict, its exit code and the hosts' scheduling depend on:
# `-p no:NAME` blocks a plugin by name, and a run without one of these would judge what it never saw.
# dflash-progress, dflash-html and dflash-junit-evidence only show things: blocking them changes no verdict.
REQUIRED_PARTS = ("dflash-verdicts", "dflash-selection", "dflash-xdist", "dflash-host-scheduler")


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """The run: discovery of attached servers, the services, the hooks (report/started.py has already loaded
    the targets and written each host's 'interrupted' verdict, before every other plugin's
    pytest_configure)."""
    for layer in LAYERS:
        config.addinivalue_line("markers", f"{layer}: pytest-dflash {layer} layer — {LAYER_HELP[layer]}")
    config.addinivalue_line("markers", collection.SERVICES_MARKER)
    if BUILDER_KEY not in config.stash:
        # `-p no:pytest_dflash.report.started`: the run starts all the same, then is refused (imported here:
        # at the top it would be imported before pytest rewrites it as one of pytest_plugins, with a warning)
        from pytest_dflash.report import started

        started.begin(config)
    profiles = config.stash[TARGETS_KEY]
    try:
        _refuse_blocked_parts(config)
        _configure_run(config, profiles, config.stash[BUILDER_KEY].run_id,
                       getattr(config, "workerinput", None))
    except pytest.UsageError as exc:
        if profiles and report_session.writes_verdicts(config):
            report_session.refuse(config, config.stash[BUILDER_KEY], options.report_dir(config),
                                  list(profiles), exc)
        raise


def _refuse_blocked_parts(config: pytest.Config) -> None:
    """`-p no:` on a part the verdict depends on: a usage error, never a run judged without it."""
    blocked = [name for name in (*pytest_plugins, *REQUIRED_PARTS) if config.pluginmanager.is_blocked(name)]
    if blocked:
        raise pytest.UsageError(f"-p no:{blocked[0]}: pytest-dflash cannot judge a run without this part of "
                                "itself; unblock it (or turn the whole plugin off with -p no:dflash)")


def _register(config: pytest.Config, plugin: object, name: str) -> None:
    if config.pluginmanager.register(plugin, name) is None and name in REQUIRED_PARTS:
        raise pytest.UsageError(f"-p no:{name}: pytest-dflash cannot judge a run without this part of itself")


def _configure_run(config: pytest.Config, profiles: dict[str, HostProfile], run_id: str,
                   workerinput: dict[str, Any] | None) -> None:
    run_options = RunOptions(
        provision=bool(options.option(config, "dflash_provision")),
        keep=bool(options.option(config, "dflash_keep")),
        journal_lines=options.number(config, "dflash_journal_lines", int, 200, low=0),
        report_dir=options.report_dir(config),
        ready_timeout_s=options.duration(config, "dflash_ready_timeout", None),
        lock_wait_s=options.duration(config, "dflash_lock_wait", "10m", allow_zero=True) or 0.0,
        request_timeout_s=options.duration(config, "dflash_request_timeout", "60s") or 60.0,
    )
    config.stash[GATE_KEY] = options.gate_layers(config)
    if profiles and workerinput is None and getattr(config.option, "dist", "no") == "each":
        raise pytest.UsageError("--dist each runs every test on every xdist worker: each worker would start "
                                "the same hosts' services at once; use -n N (--dist load, scheduled by host)")
    for profile in profiles.values():
        if run_options.provision and profile.provision == "never":
            raise pytest.UsageError(f"{profile.source}: host.provision = \"never\" but --provision was given")
    # Attached servers' algorithms, before collection: asked by the controller, taken by its workers.
    answers = workerinput["dflash_discovered"] if workerinput and "dflash_discovered" in workerinput else (
        discovery.discover(profiles))
    profiles = discovery.apply(profiles, answers)
    # report/progress.py: xdist, -q, live line
    channel = ProgressChannel(config, run_id, hosts=list(profiles))
    run = DflashRun(profiles, run_options, run_id, progress=channel)
    attach.remember_run_secrets(run)
    config.stash[RUN_KEY] = run
    if not profiles:
        return
    cleanup.arm(config, run)
    config.pluginmanager.register(channel, "dflash-progress")
    channel.start()
    if config.pluginmanager.hasplugin("xdist"):
        _register(config, _XdistHooks(run, answers, channel), "dflash-xdist")
        if (getattr(config.option, "dist", "no") in scheduling.SCHEDULED_DIST
                and not hasattr(config, "workerinput")):
            # Each host's tests in one worker (its lock, its service state), a fixed one, which readies all of
            # its hosts at once; test ids stay pytest's own (fleet/scheduling.py).
            _register(config, scheduling.HostScheduler(config, run), "dflash-host-scheduler")
    # Where the tests are collected (an -n controller collects nothing: its workers send theirs).
    _register(config, report_session.SelectionRecorder(config), "dflash-selection")
    if report_session.writes_verdicts(config):
        collector = report_session.VerdictCollector(config, config.stash[BUILDER_KEY])
        _register(config, collector, "dflash-verdicts")
    if getattr(config.option, "xmlpath", None) and not hasattr(config, "workerinput"):  # junitxml runs there
        config.pluginmanager.register(attach.JUnitEvidence(), "dflash-junit-evidence")
    if config.pluginmanager.hasplugin("html"):
        from pytest_dflash.fleet.trend import changes_since_good
        from pytest_dflash.report import html

        config.pluginmanager.register(html.HtmlHooks(config, changes=changes_since_good), "dflash-html")


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Generator[None, Any, Any]:
    """An internal error (exit 3, or one raised past pytest itself) never leaves an older `pass` standing:
    also one raised before the run's start wrote its `interrupted` verdicts (a conftest's tryfirst
    pytest_configure), or after its end wrote the final ones (a later plugin's pytest_sessionfinish)."""
    try:
        code = yield
    except BaseException as exc:
        if not isinstance(exc, (pytest.UsageError, KeyboardInterrupt, SystemExit)):
            report_session.leave_no_pass(config, f"internal error: {type(exc).__name__}: {exc}")
        raise
    if code == pytest.ExitCode.INTERNAL_ERROR and REPORTED_KEY not in config.stash:
        report_session.leave_no_pass(config, "internal error (exit 3) before the run wrote its verdicts")
    return code


@pytest.hookimpl(tryfirst=True)  # before the terminal reporter prints its traceback
def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    interrupts.mark_delivered()  # pytest has it: the waits need not raise it again
    if interrupts.mend_traceback(excinfo.value) is not None:
        excinfo.traceback = pytest.ExceptionInfo.from_exception(excinfo.value).traceback


def pytest_unconfigure(config: pytest.Config) -> None:
    cleanup.disarm(config, config.stash.get(RUN_KEY, None))


class _XdistHooks:
    """Give every worker the controller's run id (one run, one set of markers and locks), its answers about
    attached servers (so every worker collects the same tests) and the progress file it writes to."""

    def __init__(self, run: DflashRun, answers: discovery.Answers, progress: ProgressChannel) -> None:
        self.run = run
        self.answers = answers
        self.progress = progress

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["dflash_run_id"] = self.run.run_id
        node.workerinput["dflash_discovered"] = self.answers
        node.workerinput.update(self.progress.workerinput())


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.profiles:
        return []
    mode = "provision" if run.options.provision else "attach"
    hosts = ", ".join(f"{p.name} ({p.display_connection or 'url only'}; {len(p.services)} "
                      f"service{'s' if len(p.services) != 1 else ''}; "
                      f"{'provision' if p.provision == 'always' else mode})" for p in run.profiles.values())
    return [f"dflash: run {run.run_id}; hosts: {hosts}"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    run = metafunc.config.stash.get(RUN_KEY, None)
    if run is not None and any(name in metafunc.fixturenames for name in collection.DFLASH_FIXTURES):
        collection.parametrize(metafunc, run)


@pytest.hookimpl(tryfirst=True)  # before xdist's worker loop takes its first test
def pytest_runtestloop(session: pytest.Session) -> None:
    """The hosts' services come up in parallel behind the tests (run/preflight.py; each host's first test
    waits for its own host): without xdist every host's; in an xdist worker the hosts it owns
    (fleet/scheduling.py). Not on the controller of -n."""
    config = session.config
    run = config.stash.get(RUN_KEY, None)
    if (run is None or not run.profiles or config.pluginmanager.has_plugin("dsession")
            or config.getoption("collectonly", False) or session.testsfailed):
        return
    hosts: list[str] | None = None
    if hasattr(config, "workerinput"):
        hosts = scheduling.worker_hosts(config, (item.nodeid for item in session.items), run)
        if hosts is None:
            return  # a scheduler that hands out hosts as they come: this worker cannot know its hosts
    concurrency = options.number(config, "dflash_fleet_concurrency", int, preflight.DEFAULT_CONCURRENCY,
                                 low=1)
    # here: a plugin module pytest imports (and rewrites)
    from pytest_dflash.layers.gpu import hooks as gpu_hooks

    preflight.preflight(run, concurrency, hosts=hosts,
                        who=str(getattr(config, "workerinput", {}).get("workerid", "")),
                        probe=gpu_hooks.inventory_probe(config))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    collection.order_items(config, config.stash.get(RUN_KEY, None), items)


def pytest_collection_finish(session: pytest.Session) -> None:
    collection.record_needed(session.config.stash.get(RUN_KEY, None), session.items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    info = item.stash.get(INFO_KEY, None)
    run = item.config.stash.get(RUN_KEY, None)
    if info is None or run is None:
        return
    host = run.host(info.host)
    try:
        preflight.wait_for_host(host)  # the fleet pre-flight still bringing this host up
    except BaseException:
        # e.g. pytest-timeout's kill: the test's services fail with it (run/timeouts.py), as in a readiness
        # wait
        from pytest_dflash.run.fixtures import use_service  # a plugin module pytest imports (and rewrites)

        for name in info.services:
            use_service(item, host.service(name))
        raise
    failure = run.book.blocker(info.host, info.layer, info.services)
    if failure is not None:
        info.blocked = True
        pytest.skip(blocked_reason(failure))
    attach.mark_logs(item, run, info)


# innermost: it sees what the test raised before any other wrapper could swallow it (run/raised.py)
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if item.stash.get(INFO_KEY, None) is None:
        return (yield)
    return (yield from raised.watch_call(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    info = item.stash.get(INFO_KEY, None)
    run = item.config.stash.get(RUN_KEY, None)
    if info is not None and run is not None:
        timeouts.record_timeout_kill(item, report, run, info.host)
        attach.annotate(item, call, report, run, info)
        skips.record_origin(item, call, report)  # after annotate: into the property it wrote
        raised.record(item, report)
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run = config.stash.get(RUN_KEY, None)
    if EMPTY_SHARD_KEY in config.stash and run is not None and not run.profiles:
        report_session.finish_empty_shard(session)
    if run is None or not run.profiles:
        return
    for problem in run.cleanup():
        run.progress(f"cleanup problem: {problem}")
    collector = config.pluginmanager.get_plugin("dflash-verdicts")
    if isinstance(collector, report_session.VerdictCollector):
        report_session.finish(session, collector)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is not None and run.profiles and report_session.writes_verdicts(config):
        report_session.terminal_summary(terminalreporter, config)
    elif run is not None and EMPTY_SHARD_KEY in config.stash and report_session.writes_verdicts(config):
        report_session.empty_shard_summary(terminalreporter, config, config.stash[EMPTY_SHARD_KEY])
