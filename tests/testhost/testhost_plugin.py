"""pytest fixtures for the test host (a real systemd + sshd host in a network namespace).

Loaded by ``tests/testhost/conftest.py``. Other test directories can use the same fixtures by adding
to ``tests/conftest.py``::

    sys.path.insert(0, str(Path(__file__).parent / "testhost"))
    pytest_plugins = ["testhost_plugin"]

Fixtures:
  ``testhost`` (session): a running :class:`testhost.TestHost`. Uses the instance named by
      ``DFLASH_TESTHOST_STATE=<state dir>`` when set (not torn down here); otherwise builds the
      rootfs if needed and boots an instance of its own (one per xdist worker), torn down at the end
      of the session, Ctrl-C and SIGTERM included.
  ``testhost_factory`` (function): ``factory(**up_kwargs) -> TestHost`` for tests that need an
      instance of their own (teardown tests, killed-run tests); whatever it made and the test did
      not take down is taken down after the test.

When the machine cannot run a test host, both skip with the reason, or fail with it when
``DFLASH_REQUIRE_TESTHOST=1`` (CI). Tests using them get the ``testhost`` marker automatically.
Build/up/down timings are printed live and in a "testhost" section of the terminal summary.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import testhost as thapi  # noqa: E402

ENV_STATE = "DFLASH_TESTHOST_STATE"
ENV_REQUIRE = "DFLASH_REQUIRE_TESTHOST"
_WORKEROUTPUT_KEY = "dflash_testhost_timings"
_lines_key = pytest.StashKey[list[str]]()


def _lines(config: pytest.Config) -> list[str]:
    return config.stash.setdefault(_lines_key, [])


def _say(config: pytest.Config, msg: str) -> None:
    """Record a summary line and show it right away, past pytest's output capture."""
    _lines(config).append(msg)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # xdist worker: the controller prints it (pytest_testnodedown)
        workeroutput[_WORKEROUTPUT_KEY] = list(_lines(config))
        return
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is None:
        return
    ctx = capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
    with ctx:
        tr.write_line(f"[testhost] {msg}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "testhost" in names or "testhost_factory" in names:
            item.add_marker(pytest.mark.testhost)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(_lines_key, [])
    if lines:
        terminalreporter.section("testhost", sep="-")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: collect the workers' timing lines for the summary."""
    out = getattr(node, "workeroutput", None) or {}
    wid = getattr(node, "workerinput", {}).get("workerid", "?")
    _lines(node.config).extend(f"[{wid}] {line}" for line in out.get(_WORKEROUTPUT_KEY, []))


def unavailable(reason: str) -> None:
    """Skip (or fail, under DFLASH_REQUIRE_TESTHOST=1) because no test host can run here."""
    msg = f"test host unavailable: {reason}"
    if os.environ.get(ENV_REQUIRE) == "1":
        pytest.fail(f"{msg} ({ENV_REQUIRE}=1)", pytrace=False)
    pytest.skip(msg)


class _SigtermAsInterrupt:
    """While a fixture owns an instance: SIGTERM -> KeyboardInterrupt, so pytest unwinds and the
    finalizers take the instance down (default SIGTERM would leave it for the next up to reap).
    While ``deferred``, SIGTERM is only remembered, and re-sent once the teardown is done."""

    def __init__(self) -> None:
        self.deferred = False
        self.pending = False
        self.active = False

    def __enter__(self) -> _SigtermAsInterrupt:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._handler)
            self.active = True
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.deferred:
            self.pending = True
            return
        raise KeyboardInterrupt("SIGTERM")

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if self.pending:
                os.kill(os.getpid(), signal.SIGTERM)


def _own_instance(config: pytest.Config, label: str, **up_kwargs: Any) -> thapi.TestHost:
    th = thapi.up(**up_kwargs)
    _say(config, f"{label}: up {th.name} ({th.guest_ip}) in {th.up_seconds:.2f}s")
    return th


def _take_down(config: pytest.Config, th: thapi.TestHost, label: str) -> None:
    secs = thapi.down(th)
    left = thapi.leftovers(th)
    _say(config, f"{label}: down {th.name} in {secs:.2f}s" + (f"; LEFT BEHIND: {left}" if left else ""))
    if left:
        raise thapi.TestHostError(f"down left things behind: {left}")


@pytest.fixture(scope="session")
def testhost(request: pytest.FixtureRequest) -> Iterator[thapi.TestHost]:
    config = request.config
    state = os.environ.get(ENV_STATE)
    if state:
        try:
            th = thapi.attach(state)
        except (OSError, thapi.TestHostError) as e:
            pytest.fail(f"{ENV_STATE}={state}: {e}", pytrace=False)
        _say(config, f"using running instance {th.name} ({th.guest_ip}) from {ENV_STATE}")
        yield th
        return
    reason = thapi.can_run()
    if reason is not None:
        unavailable(reason)
    build_s = thapi.build()
    _say(config, f"build (cached rootfs + venv, {thapi.rootfs()}) in {build_s:.2f}s")
    with _SigtermAsInterrupt() as term:
        th = _own_instance(config, "session")
        try:
            yield th
        finally:
            term.deferred = True
            _take_down(config, th, "session")


@pytest.fixture
def testhost_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., thapi.TestHost]]:
    config = request.config
    reason = thapi.can_run()
    if reason is not None:
        unavailable(reason)
    thapi.build()
    made: list[thapi.TestHost] = []

    def factory(**up_kwargs: Any) -> thapi.TestHost:
        th = _own_instance(config, request.node.name, **up_kwargs)
        made.append(th)
        return th

    with _SigtermAsInterrupt() as term:
        try:
            yield factory
        finally:
            term.deferred = True
            errors: list[str] = []
            for th in made:
                if th.state_dir.exists():
                    try:
                        thapi.down(th)
                    except (OSError, thapi.TestHostError) as e:  # go on with the others
                        errors.append(f"{th.name}: {e}")
            if errors:
                raise thapi.TestHostError("; ".join(errors))
