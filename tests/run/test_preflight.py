"""run/preflight.py: the hosts' bring-ups run behind the tests; a host's test waits for its own host's only; a bug
in a bring-up is raised where the host's tests wait; the run's cleanup drops the bring-ups not begun and nothing
is started after it. Real threads, real hosts of the embedded profile (no service is started here)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.errors import ServiceError
from pytest_dflash.run.preflight import preflight, wait_for_host
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun, HostContext

LOCAL = Path(__file__).parents[2] / "pytest_dflash" / "config" / "builtin" / "local.toml"


def fleet(*names: str) -> DflashRun:
    profiles = {name: load_profile(LOCAL, name=name) for name in names}
    run = DflashRun(profiles, RunOptions(), "r1")
    for name in names:
        run.host(name).gpu_tested = True  # the probe is the whole bring-up: no service needed
    return run


class Probes:
    """A bring-up probe per host: blocks until released, or raises; records which hosts it ran for."""

    def __init__(self, *, held: tuple[str, ...] = (), broken: tuple[str, ...] = ()) -> None:
        self.release = threading.Event()
        self.held, self.broken = held, broken
        self.ran: list[str] = []

    def __call__(self, host: HostContext) -> None:
        self.ran.append(host.name)
        if host.name in self.broken:
            raise RuntimeError(f"a bug probing {host.name}")
        if host.name in self.held:
            assert self.release.wait(30)


def test_a_host_without_a_bring_up_is_no_wait() -> None:
    run = fleet("a")
    preflight(run, 8, probe=Probes(held=("a",)))  # one host: nothing to overlap, no pre-flight
    assert run.host("a").bring_up is None
    wait_for_host(run.host("a"))


def test_a_hosts_wait_ends_with_its_own_bring_up_not_the_others() -> None:
    run = fleet("a", "b")
    probes = Probes(held=("b",))
    preflight(run, 8, probe=probes)
    try:
        started = time.monotonic()
        wait_for_host(run.host("a"))  # b is still held
        later = run.host("b").bring_up
        assert time.monotonic() - started < 5 and later is not None and not later.done()
    finally:
        probes.release.set()
    wait_for_host(run.host("b"))
    assert run.host("b").bring_up is None and sorted(probes.ran) == ["a", "b"]


def test_a_bug_in_a_bring_up_is_raised_in_each_of_its_hosts_waits() -> None:
    run = fleet("a", "b")
    preflight(run, 8, probe=Probes(broken=("a",)))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="a bug probing a"):
            wait_for_host(run.host("a"))
    wait_for_host(run.host("b"))


def test_the_runs_cleanup_drops_the_bring_ups_not_begun() -> None:
    run = fleet("a", "b", "c")
    lines: list[str] = []
    run.progress = lines.append
    probes = Probes(held=("a", "b"))
    preflight(run, 2, probe=probes)  # two at a time: c waits for a free thread
    try:
        run.cleanup()
        third = run.host("c").bring_up
        assert third is not None and third.cancelled()
        wait_for_host(run.host("c"))  # no wait for a cancelled bring-up
    finally:
        probes.release.set()
    wait_for_host(run.host("a"))
    wait_for_host(run.host("b"))
    assert "c" not in probes.ran
    assert not any("hosts in" in line for line in lines), lines  # no "3 hosts in Xs": one never came up


def test_nothing_is_started_after_the_runs_cleanup() -> None:
    """A bring-up thread that reaches a provisioned service's start after the cleanup began starts nothing: the
    cleanup would not stop it (a later run's reaper would)."""
    profile = load_profile(LOCAL, name="late")
    run = DflashRun({profile.name: profile}, RunOptions(provision=True), "r1")
    host = run.host("late")
    run.cleanup()
    try:
        with pytest.raises(ServiceError, match="late: not started: the run is ending"):
            host.prestart(host.service("dflash"))
        assert not host.service("dflash").manager.provisioned
    finally:
        host.teardown()  # had it started one (the defect), stop it


def test_the_runs_cleanup_ends_a_readiness_wait_at_once(tmp_path: Path) -> None:
    """An attached server that never answers (nothing listens: refused, retried until the 60 s budget): after the
    run's cleanup began (-x, Ctrl-C) the pre-flight threads end within a poll, not at the budget — the process
    exits only when they do — and the service's failure says why."""
    with socket.socket() as spare:  # a loopback port nothing listens on
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    profiles = {}
    for name in ("d1", "d2"):
        path = tmp_path / f"{name}.toml"
        path.write_text(f'[host]\nconnection = "local://"\n\n[services.s]\nkind = "external"\nalgorithm = "DFLASH"\n'
                        f'url = "http://127.0.0.1:{port}"\nready_timeout = "60s"\n')
        profiles[name] = load_profile(path)
    run = DflashRun(profiles, RunOptions(), "r1")
    for name in profiles:
        run.host(name).needed.add("s")
    preflight(run, 8)
    futures = [run.host(name).bring_up for name in profiles]
    time.sleep(0.5)  # both waits are polling
    assert all(f is not None and not f.done() for f in futures)
    started = time.monotonic()
    run.cleanup()
    for future in futures:
        assert future is not None
        future.result(timeout=5)
    assert time.monotonic() - started < 5
    for name in profiles:
        failure = run.host(name).service("s").failure
        assert failure is not None and "the run ended before the service was ready" in str(failure), failure
