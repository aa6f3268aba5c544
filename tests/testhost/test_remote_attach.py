"""Attach mode (the default: no --provision) only reads the host.

The run's audit trail (`$DFLASH_COMMAND_LOG`: every command the transport or the host lock sends)
must hold only commands from a read-only allowlist, none declared mutating; the units it looked at
must be exactly as they were. And the guard itself: in attach mode a state-changing call raises
ReadOnlyViolation before anything is sent.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from remote_helpers import (
    GUEST_PYTHON,
    UNIT_DIR,
    Guest,
    RefUnit,
    SuiteRun,
    render_unit,
    unit_name,
    write_profile,
)
from testhost import TestHost

from pytest_dflash.config.loader import load_profile
from pytest_dflash.errors import DflashError, ReadOnlyViolation
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

Runs = Callable[..., SuiteRun]
UNIT = r"[\w@.-]+\.service"
SINCE = r"--since @\d+(\.\d+)?"
# What attach mode may send: reads of unit state, journals, the kernel log, the clock. Nothing else
# (a new kind of command the plugin sends in attach mode must be added here deliberately).
READ_ONLY = [re.compile(p) for p in (
    r"echo dflash-ping",
    r"date \+%s\.%N",
    rf"systemctl show -p [A-Za-z]+(,[A-Za-z]+)* {UNIT}",
    rf"systemctl (is-active|is-failed|status --no-pager) {UNIT}",
    rf"journalctl -u {UNIT}( {SINCE})? -n \d+ --all --no-pager 2>&1",
    rf"\(journalctl -k ({SINCE}|-b) --no-pager 2>/dev/null \|\| dmesg -T 2>/dev/null\) \| grep -E '[^']*' "
    r"\| tail -n \d+",
    rf"cat {UNIT_DIR}/{UNIT}",
)]
# Probes are sent inline (`printf %s <base64> | base64 -d | <python> - <args>`); these only read
# (reviewed: they list, stat and query; nvidia-smi queries, metadata, journal). kernels.py is not
# one of them: it compiles (in a scratch dir), which is a layer attach mode must not run unasked.
# import_chain.py imports the server's modules in child interpreters, FlashInfer's JIT workspace pointed at a
# scratch directory it removes: no file of the host changes, no kernel is built or launched.
READ_ONLY_PROBES = ("gpu_inventory.py", "cuda_toolkit.py", "jit_cache.py", "kernel_log.py", "packages.py",
                    "sgl_kernel_builds.py", "torch_facts.py", "import_chain.py")
PROBE = re.compile(r"printf %s (?P<source>[A-Za-z0-9+/=]+) \| base64 -d \| (?P<python>\S+)(?: -S)? - .*", re.S)
PROBES = Path(__file__).resolve().parents[2] / "pytest_dflash" / "hostaccess" / "probes"
ALL_SUITES = ("smoke", "host", "env", "kernels", "service", "generation", "parity", "perf")


def read_only(command: str, python: str) -> bool:
    if any(p.fullmatch(command) for p in READ_ONLY):
        return True
    probe = PROBE.fullmatch(command)
    if probe is None or probe["python"] != python:
        return False
    source = base64.b64decode(probe["source"]).decode()
    return any((PROBES / name).is_file() and (PROBES / name).read_text() == source for name in READ_ONLY_PROBES)


def _sent(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.heavy
@pytest.mark.timeout(600)  # every suite against three units on a shared 2-core machine
def test_attach_sends_only_read_only_commands(testhost: TestHost, guest: Guest, runs: Runs, tmp_path: Path) -> None:
    # Two units the test starts itself: a healthy one, and one that is SIGKILLed during the tests (so
    # that failure evidence is collected too: journal, unit properties, kernel log).
    units = {"good": RefUnit(unit_name("ro-good"), "DFLASH"),
             "plain": RefUnit(unit_name("ro-plain"), "NONE"),
             "oom": RefUnit(unit_name("ro-oom"), "DFLASH", "--inject oom-kill=3")}
    for name, spec in units.items():
        guest.track(spec.unit)
        guest.install_unit(spec.unit, render_unit(spec, name))
    before = {name: guest.show(spec.unit, "InvocationID", "MainPID", "ActiveState") for name, spec in units.items()}
    assert all(props["ActiveState"] == "active" for props in before.values()), before
    profile = write_profile(tmp_path, testhost, "ro", units, parity=("plain", ["good"]))
    log = tmp_path / "commands.jsonl"
    # Every layer smoke and the full suites run (issue 11 item 8): nothing in any of them may change the host,
    # the server (no POST /flush_cache) or use its GPUs (the kernels layer skips, naming --allow-gpu-use).
    # A short perf run: what it measures is not the point here (an INCONCLUSIVE floor may fail), what it sends is.
    outcome = runs(profile, "--perf-requests", "24", "--perf-warmup", "1", env={"DFLASH_COMMAND_LOG": str(log)},
                   suites=ALL_SUITES).wait(540)
    outcome.assert_clean()
    data = outcome.verdict("ro")
    assert data["services"]["good"]["provisioned"] is False
    assert [f["services"] for f in data["failures"] if f["layer"] != "perf"] == [["oom"]], data["failures"]
    assert "journal ro/oom since" in outcome.out  # evidence was collected, through the same audit trail

    sent = _sent(log)
    assert sent, "the run logged no command at all"
    for record in sent:
        assert record["host"] == "ro" and record["read_only"] is True and record["mutating"] is False, record
        command = str(record["command"])
        assert read_only(command, GUEST_PYTHON), f"not a read-only command: {command[:300]}"
    kinds = {str(r["command"]).split(" ")[0] for r in sent}
    assert {"echo", "date", "systemctl", "journalctl", "(journalctl"} <= kinds, kinds

    layers = data["layers"]
    assert {layer for layer, o in layers.items() if o["outcome"] != "not-run"} >= {
        "host", "env", "service", "generation", "parity", "perf"}, layers
    assert "--allow-gpu-use" in outcome.out or layers["kernels"]["outcome"] in ("skipped", "not-run"), layers
    served = guest.journal_text(units["good"].unit)
    assert "POST /flush_cache" not in served, "attach mode sent POST /flush_cache to a server it did not start"
    assert "POST /generate" in served  # the journal does show the requests the run sent

    # The units are as the run found them: same process, same invocation; the dead one not reset.
    assert guest.show(units["good"].unit, "InvocationID", "MainPID", "ActiveState") == before["good"]
    oom = guest.show(units["oom"].unit, "ActiveState", "Result", "ExecMainStatus")
    assert oom == {"ActiveState": "failed", "Result": "signal", "ExecMainStatus": "9"}
    assert all(guest.unit_file_exists(spec.unit) for spec in units.values())


def test_attach_refuses_state_changes_before_sending_them(testhost: TestHost, guest: Guest, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "commands.jsonl"
    monkeypatch.setenv("DFLASH_COMMAND_LOG", str(log))
    spec = RefUnit(unit_name("ro-guard"), "DFLASH")
    guest.track(spec.unit)
    profile = load_profile(write_profile(tmp_path, testhost, "guard", {"dflash": spec}))
    run = DflashRun({"guard": profile}, RunOptions(provision=False, report_dir=tmp_path), "guardrun")
    host = run.host("guard")
    try:
        assert host.transport.read_only
        handle = host.service("dflash")
        probe = f"/root/dflash-guard-{spec.port}"
        with pytest.raises(ReadOnlyViolation, match="attach mode refuses a state-changing command"):
            handle.manager.start()  # would install and start the unit
        with pytest.raises(ReadOnlyViolation):
            host.transport.write_file(probe, "x")
        with pytest.raises(ReadOnlyViolation):
            host.transport.run("systemctl daemon-reload", mutating=True)
        # the readiness path of attach mode never starts a unit that is not running: it reports it
        with pytest.raises(DflashError, match="attach mode never starts it"):
            handle.ensure_ready()
    finally:
        assert run.cleanup() == []
    sent = _sent(log)
    assert sent and not [r for r in sent if r["mutating"]], sent
    assert all(read_only(str(r["command"]), GUEST_PYTHON) for r in sent), sent
    # nothing reached the guest
    assert not guest.unit_file_exists(spec.unit)
    assert guest.sh(f"ls {probe}* 2>/dev/null || true").strip() == ""
