"""pytest plugin: options, markers, fixtures and the hooks that turn test outcomes into host verdicts.

Loaded through the `pytest11` entry point. It does nothing unless a target is given
(`--host`, `--attach` or `--fleet`), so it is safe to have installed in any project.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from pytest_dflash.config.durations import parse_seconds
from pytest_dflash.config.profiles import HostProfile, attach_profile, load_profile, resolve_profile_path
from pytest_dflash.errors import DflashError, InventoryError, ServiceCrashed, ServiceRestarted
from pytest_dflash.evidence.gather import gather
from pytest_dflash.evidence.redact import redact
from pytest_dflash.fleet import inventory
from pytest_dflash.report.verdict import VerdictBuilder, summary_lines
from pytest_dflash.run.layers import LAYER_HELP, LAYERS, Failure, blocked_reason, rank
from pytest_dflash.run.state import DflashRun, HostContext, RunOptions, ServiceHandle, readiness_error_summary
from pytest_dflash.services.base import LogMark

HOST_HELP = ("host profile to test: a name looked up in --hosts-dir (or the built-in 'local'), "
             "or a path to a .toml file; repeatable")
ATTACH_HELP = "attach to an already running OpenAI-compatible server at URL (no host access); repeatable"
PROVISION_HELP = ("deploy and start the profile's services (systemd units / processes) and remove them afterwards; "
                  "default: attach to the services already running")
KEEP_HELP = "leave provisioned services running after the run (for debugging)"
JOURNAL_LINES_HELP = "lines of service log / journal attached to each failure (default 200)"
HOSTS_DIR_HELP = "directory of host profiles (default: ./hosts)"
REPORT_HELP = "directory for verdict JSON files (default: reports)"
READY_TIMEOUT_HELP = "override every service's readiness budget (e.g. 90s, 15m)"
GATE_HELP = ("comma-separated layers that must pass on every host for exit code 0, e.g. "
             "'host,service,generation,parity' (see docs/gating.md)")
LOCK_WAIT_HELP = "how long to wait for another run's host lock before failing (default 10m)"
REQUEST_TIMEOUT_HELP = "timeout of one HTTP request made by a test (default 60s; readiness has its own budgets)"

# Layer modules that add their own options and hooks register here (pytest loads them with this plugin).
pytest_plugins: list[str] = ["pytest_dflash.layers.gpu.hooks", "pytest_dflash.fleet.hooks",
                              "pytest_dflash.layers.parity.hooks", "pytest_dflash.layers.perf.hooks"]

RUN_KEY = pytest.StashKey[DflashRun]()
EMPTY_SHARD_KEY = pytest.StashKey[str]()
BUILDER_KEY = pytest.StashKey[VerdictBuilder]()
INFO_KEY = pytest.StashKey["ItemInfo"]()
MARKS_KEY = pytest.StashKey[dict[str, LogMark]]()
HANDLES_KEY = pytest.StashKey[list[ServiceHandle]]()
DFLASH_FIXTURES = ("dflash_host", "dflash_service", "dflash_service_raw", "dflash_pair")


@dataclass
class ItemInfo:
    """What a test item targets: one host, some services of it, one layer."""

    host: str
    services: tuple[str, ...]
    layer: str
    param: str
    blocked: bool = False
    diagnosis: list[dict[str, str]] = field(default_factory=list)


# ---- options -----------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dflash", "pytest-dflash: DFlash / DDTree inference host acceptance")
    group.addoption("--host", action="append", dest="dflash_hosts", default=None, metavar="NAME|PATH",
                    help=HOST_HELP)
    group.addoption("--attach", action="append", dest="dflash_attach", default=None, metavar="URL",
                    help=ATTACH_HELP)
    group.addoption("--provision", action="store_true", dest="dflash_provision", default=None,
                    help=PROVISION_HELP)
    group.addoption("--keep", action="store_true", dest="dflash_keep", default=None, help=KEEP_HELP)
    group.addoption("--journal-lines", dest="dflash_journal_lines", default=None, metavar="N",
                    help=JOURNAL_LINES_HELP)
    group.addoption("--hosts-dir", dest="dflash_hosts_dir", default=None, metavar="DIR", help=HOSTS_DIR_HELP)
    group.addoption("--dflash-report", dest="dflash_report", default=None, metavar="DIR", help=REPORT_HELP)
    group.addoption("--ready-timeout", dest="dflash_ready_timeout", default=None, metavar="DURATION",
                    help=READY_TIMEOUT_HELP)
    group.addoption("--gate", dest="dflash_gate", default=None, metavar="LAYERS", help=GATE_HELP)
    group.addoption("--lock-wait", dest="dflash_lock_wait", default=None, metavar="DURATION", help=LOCK_WAIT_HELP)
    group.addoption("--request-timeout", dest="dflash_request_timeout", default=None, metavar="DURATION",
                    help=REQUEST_TIMEOUT_HELP)
    group.addoption("--fleet", action="append", dest="dflash_fleet", default=None, metavar="DIR|FILE[:GROUP]",
                    help=inventory.FLEET_HELP)
    group.addoption("--shard", dest="dflash_shard", default=None, metavar="I/N", help=inventory.SHARD_HELP)
    parser.addini("dflash_hosts", HOST_HELP, type="linelist", default=[])
    parser.addini("dflash_attach", ATTACH_HELP, type="linelist", default=[])
    parser.addini("dflash_provision", PROVISION_HELP, type="bool", default=False)
    parser.addini("dflash_keep", KEEP_HELP, type="bool", default=False)
    parser.addini("dflash_journal_lines", JOURNAL_LINES_HELP, default="200")
    parser.addini("dflash_hosts_dir", HOSTS_DIR_HELP, default="hosts")
    parser.addini("dflash_report", REPORT_HELP, default="reports")
    parser.addini("dflash_ready_timeout", READY_TIMEOUT_HELP, default="")
    parser.addini("dflash_gate", GATE_HELP, default="")
    parser.addini("dflash_lock_wait", LOCK_WAIT_HELP, default="10m")
    parser.addini("dflash_request_timeout", REQUEST_TIMEOUT_HELP, default="60s")
    parser.addini("dflash_fleet", inventory.FLEET_HELP, type="linelist", default=[])
    parser.addini("dflash_shard", inventory.SHARD_HELP, default="")


def _option(config: pytest.Config, name: str) -> Any:
    """Command line first, then the ini key of the same name."""
    value = config.getoption(name)
    if value is None or value == []:
        value = config.getini(name)
    return value


def _int_option(config: pytest.Config, name: str, flag: str) -> int:
    raw = _option(config, name)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{flag} / {name}: {raw!r} is not an integer") from None
    if value < 0:
        raise pytest.UsageError(f"{flag} / {name}: {raw!r} must not be negative")
    return value


def _duration_option(config: pytest.Config, name: str, flag: str) -> float | None:
    raw = _option(config, name)
    if raw in (None, ""):
        return None
    try:
        return parse_seconds(str(raw), where=f"{flag} / {name}")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _gate_layers(config: pytest.Config) -> list[str]:
    raw = str(_option(config, "dflash_gate") or "")
    layers = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown:
        raise pytest.UsageError(f"--gate / dflash_gate: unknown layer {unknown[0]!r} (layers: {', '.join(LAYERS)})")
    return layers


# ---- configuration -----------------------------------------------------------------------------------


def _load_profiles(config: pytest.Config) -> dict[str, HostProfile]:
    hosts_dir = Path(str(_option(config, "dflash_hosts_dir")))
    if not hosts_dir.is_absolute():
        hosts_dir = (config.invocation_params.dir / hosts_dir).resolve()
    profiles: dict[str, HostProfile] = {}
    try:
        for spec in _option(config, "dflash_hosts") or []:
            profile = load_profile(resolve_profile_path(spec, [hosts_dir]))
            profiles[profile.name] = profile
        for index, url in enumerate(_option(config, "dflash_attach") or []):
            profile = attach_profile(url, index)
            profiles[profile.name] = profile
        for spec in _option(config, "dflash_fleet") or []:
            for profile in inventory.load_fleet(str(spec), hosts_dir):
                if profile.name in profiles:
                    raise InventoryError(str(spec), profile.name, "this host name is already used by another profile")
                profiles[profile.name] = profile
    except InventoryError as exc:
        raise pytest.UsageError(str(exc)) from None
    shard = str(_option(config, "dflash_shard") or "")
    if shard:
        try:
            index, count = inventory.parse_shard(shard)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        selected = inventory.select_shard(profiles, index, count)
        if profiles and not selected:
            config.stash[EMPTY_SHARD_KEY] = f"shard {index}/{count} holds none of the {len(profiles)} hosts"
        profiles = selected
    return profiles


def pytest_configure(config: pytest.Config) -> None:
    for layer in LAYERS:
        config.addinivalue_line("markers", f"{layer}: pytest-dflash {layer} layer — {LAYER_HELP[layer]}")
    config.addinivalue_line(
        "markers",
        "dflash_services(speculative=None, algorithms=None): run only against services that match "
        "(e.g. speculative=True for accept-length checks)",
    )
    profiles = _load_profiles(config)
    gate = _gate_layers(config)
    options = RunOptions(
        provision=bool(_option(config, "dflash_provision")),
        keep=bool(_option(config, "dflash_keep")),
        journal_lines=_int_option(config, "dflash_journal_lines", "--journal-lines"),
        report_dir=_report_dir(config),
        ready_timeout_s=_duration_option(config, "dflash_ready_timeout", "--ready-timeout"),
        lock_wait_s=_duration_option(config, "dflash_lock_wait", "--lock-wait") or 600.0,
        request_timeout_s=_duration_option(config, "dflash_request_timeout", "--request-timeout") or 60.0,
    )
    for profile in profiles.values():
        if options.provision and profile.provision == "never":
            raise pytest.UsageError(f"{profile.source}: host.provision = \"never\" but --provision was given")
    workerinput = getattr(config, "workerinput", None)
    run_id = workerinput.get("dflash_run_id") if workerinput else None
    run = DflashRun(profiles, options, run_id or uuid.uuid4().hex[:12], progress=_progress_printer(config))
    config.stash[RUN_KEY] = run
    config.stash[BUILDER_KEY] = VerdictBuilder(run.run_id)
    config._dflash_gate = gate  # type: ignore[attr-defined]
    if profiles:
        _arm_cleanup(config, run)
        if config.pluginmanager.hasplugin("xdist"):
            config.pluginmanager.register(_XdistHooks(run), "dflash-xdist")
            if getattr(config.option, "dist", "no") == "load":
                # Each host's tests must run in one worker (its lock, its service state).
                config.option.dist = "loadgroup"
        if not hasattr(config, "workerinput"):
            config.pluginmanager.register(VerdictCollector(config.stash[BUILDER_KEY]), "dflash-verdicts")
        if config.pluginmanager.hasplugin("html"):
            from pytest_dflash.report import html

            config.pluginmanager.register(html.HtmlHooks(config), "dflash-html")


def _report_dir(config: pytest.Config) -> Path:
    path = Path(str(_option(config, "dflash_report")))
    return path if path.is_absolute() else config.invocation_params.dir / path


def _progress_printer(config: pytest.Config) -> Callable[[str], None]:
    def progress(message: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capture = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        quiet = capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext()
        with quiet:
            reporter.write_line(f"[dflash] {redact(message)}")

    return progress


PREVIOUS_SIGTERM_KEY = pytest.StashKey[Any]()


def _arm_cleanup(config: pytest.Config, run: DflashRun) -> None:
    """Whatever happens (session end, Ctrl-C, SIGTERM, interpreter exit), provisioned services go away."""
    atexit.register(run.cleanup)
    if threading_is_main():
        previous = signal.getsignal(signal.SIGTERM)
        config.stash[PREVIOUS_SIGTERM_KEY] = previous

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            raise KeyboardInterrupt("SIGTERM")  # pytest then tears down like Ctrl-C

        signal.signal(signal.SIGTERM, on_sigterm)


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is not None:
        run.cleanup()
        atexit.unregister(run.cleanup)
    previous = config.stash.get(PREVIOUS_SIGTERM_KEY, None)
    if previous is not None and threading_is_main():
        signal.signal(signal.SIGTERM, previous)


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


class _XdistHooks:
    """Give every worker the controller's run id (one run, one set of markers and locks)."""

    def __init__(self, run: DflashRun) -> None:
        self.run = run

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["dflash_run_id"] = self.run.run_id


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.profiles:
        return []
    mode = "provision" if run.options.provision else "attach"
    hosts = ", ".join(f"{p.name} ({p.connection or 'url only'}; {len(p.services)} services; "
                      f"{'provision' if p.provision == 'always' else mode})" for p in run.profiles.values())
    return [f"dflash: run {run.run_id}; hosts: {hosts}"]


# ---- collection ----------------------------------------------------------------------------------


def _selected(handle_spec: Any, marker: pytest.Mark | None) -> bool:
    if marker is None:
        return True
    speculative = marker.kwargs.get("speculative")
    algorithms = marker.kwargs.get("algorithms")
    if speculative is not None and handle_spec.speculative != speculative and handle_spec.kind != "external":
        return False
    return not (algorithms and handle_spec.algorithm not in algorithms and handle_spec.kind != "external")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    run = metafunc.config.stash.get(RUN_KEY, None)
    names = metafunc.fixturenames
    if run is None or not any(name in names for name in DFLASH_FIXTURES):
        return
    marker = metafunc.definition.get_closest_marker("dflash_services")
    if "dflash_pair" in names:
        pairs = []
        for host, profile in run.profiles.items():
            if profile.parity is None:
                continue
            for compared in profile.parity.compare:
                if _selected(profile.services[compared], marker):
                    pairs.append(f"{host}/{profile.parity.reference}~{compared}")
        metafunc.parametrize("dflash_pair", pairs, indirect=True, ids=pairs)
    elif "dflash_service" in names or "dflash_service_raw" in names:
        fixture = "dflash_service" if "dflash_service" in names else "dflash_service_raw"
        params = [f"{host}/{service}" for host, profile in run.profiles.items()
                  for service, spec in profile.services.items() if _selected(spec, marker)]
        metafunc.parametrize(fixture, params, indirect=True, ids=params)
    elif "dflash_host" in names:
        metafunc.parametrize("dflash_host", list(run.profiles), indirect=True, ids=list(run.profiles))


def _item_info(item: pytest.Item) -> ItemInfo | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    layer_mark = next((m.name for m in item.iter_markers() if m.name in LAYERS), None)
    for name in ("dflash_pair", "dflash_service", "dflash_service_raw", "dflash_host"):
        if name in callspec.params:
            if not isinstance(callspec.params[name], str):
                return None  # an empty parameter set (e.g. no [parity] table): pytest skips it itself
            param = callspec.params[name]
            if name == "dflash_pair":
                host, _, pair = param.partition("/")
                services: tuple[str, ...] = tuple(pair.split("~"))
            elif name == "dflash_host":
                host, services = param, ()
            else:
                host, _, service = param.partition("/")
                services = (service,)
            default = "host" if name == "dflash_host" else "generation"
            return ItemInfo(host, services, layer_mark or default, param)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash.get(RUN_KEY, None)
    uses_dflash = [item for item in items if any(f in getattr(item, "fixturenames", ()) for f in DFLASH_FIXTURES)]
    if run is None or not uses_dflash:
        return
    if not run.profiles and EMPTY_SHARD_KEY in config.stash:
        config.hook.pytest_deselected(items=uses_dflash)
        items[:] = [item for item in items if item not in uses_dflash]
        return
    if not run.profiles:
        raise pytest.UsageError(
            f"{len(uses_dflash)} pytest-dflash tests were collected but no target was given: "
            "pass --host NAME|PATH (e.g. --host local), --attach URL or --fleet FILE"
        )
    order = {name: index for index, name in enumerate(run.profiles)}
    for item in items:
        info = _item_info(item)
        if info is None:
            continue
        item.stash[INFO_KEY] = info
        # tryfirst: xdist's loadgroup only sees marks that exist before its own hook runs.
        item.add_marker(pytest.mark.xdist_group(name=info.host))
        run.host(info.host).needed.update(info.services)

    def key(item: pytest.Item) -> tuple[int, int]:
        info = item.stash.get(INFO_KEY, None)
        return (order.get(info.host, 0), rank(info.layer)) if info else (len(order), len(LAYERS))

    items.sort(key=key)  # stable: lower layers of a host run first, so they can block higher ones


# ---- fixtures ------------------------------------------------------------------------------------


def _run(request: pytest.FixtureRequest) -> DflashRun:
    run = request.config.stash.get(RUN_KEY, None)
    if run is None or not run.profiles:
        pytest.fail("pytest-dflash: no target (pass --host, --attach or --fleet)", pytrace=False)
    return run


@pytest.fixture
def dflash_run(request: pytest.FixtureRequest) -> DflashRun:
    """The run: options, hosts, layer book."""
    return _run(request)


@pytest.fixture
def dflash_host(request: pytest.FixtureRequest) -> HostContext:
    """The host under test (parametrized over every --host / --attach / fleet host)."""
    return _run(request).host(str(request.param))


def _remember(request: pytest.FixtureRequest, handle: ServiceHandle) -> None:
    handles = request.node.stash.setdefault(HANDLES_KEY, [])
    if handle not in handles:
        handles.append(handle)


def _ready_handle(request: pytest.FixtureRequest, host: str, service: str) -> ServiceHandle:
    run = _run(request)
    handle = run.host(host).service(service)
    _remember(request, handle)
    failed_before = handle.failure is not None
    try:
        handle.ensure_ready()
    except DflashError as exc:
        summary = readiness_error_summary(exc)
        if failed_before:
            pytest.skip(f"blocked: {handle.label} is not usable: {summary}")
        pytest.fail(_failure_text(exc), pytrace=False)
    return handle


@pytest.fixture
def dflash_service_raw(request: pytest.FixtureRequest) -> ServiceHandle:
    """A service handle that is NOT made ready first (for the service layer's own readiness tests)."""
    host, _, service = str(request.param).partition("/")
    handle = _run(request).host(host).service(service)
    _remember(request, handle)
    return handle


@pytest.fixture
def dflash_service(request: pytest.FixtureRequest) -> ServiceHandle:
    """A ready service (a real greedy and sampled generation succeeded), parametrized host/service."""
    host, _, service = str(request.param).partition("/")
    return _ready_handle(request, host, service)


@pytest.fixture
def dflash_client(dflash_service: ServiceHandle) -> Any:
    """The HTTP client of `dflash_service`."""
    return dflash_service.client


@pytest.fixture
def dflash_pair(request: pytest.FixtureRequest) -> tuple[ServiceHandle, ServiceHandle]:
    """(reference, compared) ready services of one host, from the profile's [parity] table."""
    host, _, pair = str(request.param).partition("/")
    reference, _, compared = pair.partition("~")
    return _ready_handle(request, host, reference), _ready_handle(request, host, compared)


def _failure_text(exc: BaseException) -> str:
    """The message of a service failure plus the end of its log, redacted."""
    text = str(exc)
    tail = getattr(exc, "log_tail", "")
    if tail:
        lines = tail.strip().splitlines()[-40:]
        text += "\n--- last lines of the service log ---\n" + "\n".join(lines)
    return redact(text)


# ---- running -------------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    info = item.stash.get(INFO_KEY, None)
    run = item.config.stash.get(RUN_KEY, None)
    if info is None or run is None:
        return
    failure = run.book.blocker(info.host, info.layer, info.services)
    if failure is not None:
        info.blocked = True
        pytest.skip(blocked_reason(failure))
    host = run.host(info.host)
    marks: dict[str, LogMark] = {}
    for name in info.services:
        handle = host.service(name)
        if handle.manager.provisioned or host.has_host_access:
            with contextlib.suppress(DflashError):
                marks[name] = handle.manager.log_mark()
    item.stash[MARKS_KEY] = marks


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    info = item.stash.get(INFO_KEY, None)
    run = item.config.stash.get(RUN_KEY, None)
    if info is None or run is None:
        return report
    host = run.host(info.host)
    handles = item.stash.get(HANDLES_KEY, [])
    death: ServiceCrashed | ServiceRestarted | None = None
    if report.when == "call":
        for handle in handles:
            death = handle.check_alive()
            if death is not None:
                run.book.record_death(Failure(info.host, "service", handle.name, item.nodeid, str(death)))
                if report.passed:
                    report.outcome = "failed"
                    report.longrepr = f"the test passed but {death}"
                break
    if report.failed:
        if call.excinfo is not None and isinstance(call.excinfo.value, DflashError):
            report.longrepr = _concise(item, call.excinfo)
        _attach_evidence(item, report, run, host, info, handles)
    elif report.skipped and report.when in ("setup", "call"):
        message = _skip_message(report)
        info.blocked = message.startswith("blocked:")
    info_dict = _report_info(item, run, host, info, handles)
    report.user_properties.append(("dflash", info_dict))
    return report


def _concise(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """A service/transport/API failure needs its message and the service log, not plugin internals."""
    where = ""
    path = str(getattr(item, "path", ""))
    for entry in reversed(excinfo.traceback):
        if str(entry.path) == path:
            where = f"{entry.path}:{entry.lineno + 1}: "
            break
    return f"{where}{type(excinfo.value).__name__}: {_failure_text(excinfo.value)}"


def _skip_message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def _attach_evidence(item: pytest.Item, report: pytest.TestReport, run: DflashRun, host: HostContext,
                     info: ItemInfo, handles: list[ServiceHandle]) -> None:
    started = time.monotonic()
    text = report.longreprtext
    marks = item.stash.get(MARKS_KEY, {})
    try:
        evidence = gather(host, handles, marks, text, lines=run.options.journal_lines)
    except DflashError as exc:  # evidence is best effort; the failure itself stands
        report.sections.append(("dflash evidence", f"could not collect evidence: {exc}"))
        return
    for title, body in evidence.sections:
        report.sections.append((title, body))
    info.diagnosis = [d.as_dict() for d in evidence.diagnoses]
    summary = evidence.diagnoses[0].one_line() if evidence.diagnoses else _first_line(text)
    service = info.services[0] if len(info.services) == 1 else None
    run.book.record(Failure(info.host, info.layer, service, item.nodeid, summary))
    for handle in handles:
        if handle.failure is not None:
            run.book.record_death(Failure(info.host, "service", handle.name, item.nodeid,
                                          readiness_error_summary(handle.failure)))
    report.sections.append(("dflash evidence", f"collected in {time.monotonic() - started:.2f}s"))
    report.longrepr = _redacted_longrepr(report)


def _redacted_longrepr(report: pytest.TestReport) -> Any:
    text = report.longreprtext
    clean = redact(text)
    return report.longrepr if clean == text else clean


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("E "):
            return line[2:].strip()[:300]
    return (text.strip().splitlines() or [""])[-1][:300]


def _report_info(item: pytest.Item, run: DflashRun, host: HostContext, info: ItemInfo,
                 handles: list[ServiceHandle]) -> dict[str, Any]:
    facts = {h.name: h.facts() for h in handles if h.ready is not None}
    for handle in handles:
        accept = handle.host.facts.get(f"accept_length:{handle.name}")
        if accept is not None:
            facts.setdefault(handle.name, {})["accept_length"] = accept
    notes, host.notes[:] = list(host.notes), []
    return {
        "host": info.host,
        "profile": str(host.profile.source),
        "connection": host.profile.connection,
        "layer": info.layer,
        "services": list(info.services),
        "blocked": info.blocked,
        "diagnosis": info.diagnosis,
        "service_facts": facts,
        "notes": notes,
        "metrics": dict(host.facts.get("metrics", {})),
        # host.facts["export"]: facts a layer wants in the verdict (env snapshot, driver, JIT cache, …)
        "facts": dict(host.facts.get("export", {})),
    }


# ---- reporting -----------------------------------------------------------------------------------------


class VerdictCollector:
    """Folds every test report into the host verdicts (controller side; also without xdist)."""

    def __init__(self, builder: VerdictBuilder) -> None:
        self.builder = builder

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == "dflash" and isinstance(value, dict):
                self.builder.add(report.nodeid, report.when, report.outcome, value, _message(report))


def _message(report: pytest.TestReport) -> str:
    if report.skipped:
        return _skip_message(report)[:300]
    if report.failed:
        for title, body in report.sections:
            if title.endswith("dflash diagnosis") and body:
                return body.splitlines()[0][:300]
        return redact(_first_line(report.longreprtext))
    return ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if EMPTY_SHARD_KEY in config.stash and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK  # an empty shard of a small fleet is not a failure
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.profiles:
        return
    problems = run.cleanup()
    for problem in problems:
        run.progress(f"cleanup problem: {problem}")
    if hasattr(config, "workerinput"):
        return
    builder = config.stash[BUILDER_KEY]
    gate_layers: list[str] = getattr(config, "_dflash_gate", [])
    gate = builder.gate(gate_layers) if gate_layers else None
    if gate is not None and session.exitstatus in (0, 1):
        session.exitstatus = 0 if gate["passed"] else 1
    paths = builder.write(run.options.report_dir, exit_code=int(session.exitstatus), gate=gate)
    config.stash[REPORTED_KEY] = [str(p) for p in paths]


REPORTED_KEY = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.profiles or hasattr(config, "workerinput"):
        return
    builder = config.stash[BUILDER_KEY]
    terminalreporter.section("dflash verdict")
    for line in summary_lines(builder):
        terminalreporter.write_line(line)
    gate_layers: list[str] = getattr(config, "_dflash_gate", [])
    if gate_layers:
        gate = builder.gate(gate_layers)
        terminalreporter.write_line(f"gate {','.join(gate_layers)}: {'PASSED' if gate['passed'] else 'FAILED'}")
    for path in config.stash.get(REPORTED_KEY, []):
        terminalreporter.write_line(f"verdict: {path}")

