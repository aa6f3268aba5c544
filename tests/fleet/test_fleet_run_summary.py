"""The end-of-run fleet summary (pytest_dflash.fleet.hooks) in real pytest runs: a fleet whose hosts
need no server (host-layer tests only), so it runs in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.promparse import parse
from support.pytest_runs import EXTERNAL_DFLASH_PROFILE

TEST_FILE = """
import json, os
import pytest

@pytest.mark.host
def test_host(dflash_host):
    env = json.loads(os.environ.get("FLEET_FACTS", "{}")).get(dflash_host.name)
    if env:
        dflash_host.facts.export["env"] = env
    assert dflash_host.name not in os.environ.get("FLEET_BROKEN", "").split(","), "host check failed"
"""
PROFILE = EXTERNAL_DFLASH_PROFILE


@pytest.fixture
def fleet_dir(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_fleet_hosts=TEST_FILE)
    hosts = pytester.path / "fleet"
    hosts.mkdir()
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        (hosts / f"{name}.toml").write_text(PROFILE)
    return hosts


def _run(pytester: pytest.Pytester, fleet_dir: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fleet", str(fleet_dir),
                                         f"--dflash-report={pytester.path / 'reports'}", *args)


def test_every_run_writes_the_summary_and_the_next_one_trends(pytester: pytest.Pytester, fleet_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    reports = pytester.path / "reports"
    monkeypatch.setenv("FLEET_FACTS", json.dumps({"gpu-b": {"packages": {"torch": "2.9.1"}, "driver": "580.65"}}))
    first = _run(pytester, fleet_dir, "-n", "2")
    assert first.ret == 0, first.stdout.str()
    first.stdout.fnmatch_lines(["fleet: 3/3 hosts pass", f"fleet summary: {reports}/fleet-summary.html"])
    assert sorted(p.name for p in reports.iterdir()) == [
        "fleet-junit.xml", "fleet-summary.html", "fleet-summary.json", "fleet.prom", "gpu-a.verdict.json",
        "gpu-b.verdict.json", "gpu-c.verdict.json", "history"]
    assert sorted(p.name for p in (reports / "history").iterdir()) == ["gpu-a", "gpu-b", "gpu-c"]

    monkeypatch.setenv("FLEET_BROKEN", "gpu-b")
    monkeypatch.setenv("FLEET_FACTS", json.dumps({"gpu-b": {"packages": {"torch": "2.10.0"}, "driver": "580.65"}}))
    prom = pytester.path / "textfile" / "dflash.prom"
    second = _run(pytester, fleet_dir, "-n", "2", "--prometheus", str(prom), "--gate", "host")
    assert second.ret == 1
    second.stdout.fnmatch_lines([
        "gate host: FAILED on gpu-b",  # once, in the dflash verdict section; the fleet headline leaves it out
        "fleet: 2/3 hosts pass",
        "new failures since *: gpu-b (host)",
        "gpu-b: failing since *; changed since last good run *: torch 2.9.1 -> 2.10.0",
        f"prometheus: {prom}",
    ])
    summary = json.loads((reports / "fleet-summary.json").read_text())
    assert {h: e["verdict"] for h, e in summary["hosts"].items()} == {"gpu-a": "pass", "gpu-b": "fail",
                                                                       "gpu-c": "pass"}
    assert summary["gate"]["failing"] == {"gpu-b": {"host": "failed"}}
    assert summary["trend"]["new_failures"][0]["host"] == "gpu-b"
    changes = summary["hosts"]["gpu-b"]["changed"]["changes"]
    assert [(c["category"], c["key"], c["before"], c["after"]) for c in changes] == [
        ("packages", "facts.env.packages.torch", "2.9.1", "2.10.0")]
    assert len(summary["run_ids"]) == 1, "one run, whatever the number of xdist workers"
    families = parse(prom.read_text())
    assert (reports / "fleet.prom").read_text() == prom.read_text()
    assert families["dflash_host_pass"].value(host="gpu-b") == 0
    assert families["dflash_layer_outcome"].value(host="gpu-b", layer="host", outcome="failed") == 1
    assert families["dflash_fleet_gate_pass"].value(layers="host") == 0


def test_summary_can_be_turned_off_and_a_bad_previous_is_a_usage_error(pytester: pytest.Pytester,
                                                                         fleet_dir: Path) -> None:
    result = _run(pytester, fleet_dir, "--no-fleet-summary")
    assert result.ret == 0
    assert sorted(p.name for p in (pytester.path / "reports").iterdir()) == [
        "gpu-a.verdict.json", "gpu-b.verdict.json", "gpu-c.verdict.json"]
    result = _run(pytester, fleet_dir, "--previous-summary", "nope.json")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --previous-summary / dflash_previous_summary: *nope.json: no such file"])


def test_a_damaged_previous_summary_is_ignored_with_a_warning(pytester: pytest.Pytester, fleet_dir: Path) -> None:
    reports = pytester.path / "reports"
    reports.mkdir()
    (reports / "fleet-summary.json").write_text("{damaged")
    result = _run(pytester, fleet_dir)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["dflash: previous summary ignored: *not a fleet summary*"])
    assert json.loads((reports / "fleet-summary.json").read_text())["totals"]["pass"] == 3


GROUPING_TEST = """
import os
import pytest

@pytest.mark.host
@pytest.mark.parametrize("step", range(4))
def test_step(dflash_host, step):
    with open(os.path.join(os.environ["FLEET_LOG"], dflash_host.name), "a") as log:
        log.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
"""


def test_with_xdist_each_host_runs_in_one_worker_and_hosts_spread(pytester: pytest.Pytester, fleet_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`-n 2` = `--dist load`, scheduled by the plugin's HostScheduling: a host's tests run in one worker,
    else its service state, lock and layer book (per process) would be split."""
    pytester.makepyfile(test_fleet_hosts=GROUPING_TEST)
    log = pytester.path / "log"
    log.mkdir()
    monkeypatch.setenv("FLEET_LOG", str(log))
    result = _run(pytester, fleet_dir, "-n", "2", "-v")
    assert result.ret == 0, result.stdout.str()
    workers = {path.name: set(path.read_text().split()) for path in log.iterdir()}
    assert sorted(workers) == ["gpu-a", "gpu-b", "gpu-c"]
    assert all(len(w) == 1 for w in workers.values()), workers
    assert set().union(*workers.values()) == {"gw0", "gw1"}, workers
    verdict = json.loads((pytester.path / "reports" / "gpu-a.verdict.json").read_text())
    assert verdict["layers"]["host"]["passed"] == 4
