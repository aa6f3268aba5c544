"""Issue 8, done when: a fleet of local profiles runs with `-n auto` in parallel with one host deliberately
broken (a refserver fault) and the others green; the merged summary and the Prometheus file show exactly that;
`--gate` exits non-zero for the broken host's layers and zero when it is excluded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import write_profile
from support.promparse import parse
from support.pytest_runs import assert_no_crash, verdict

GATE = "service,generation"
INVENTORY = """
all:
  children:
    healthy:
      hosts:
        alpha: {dflash_profile: good.toml}
        beta: {dflash_profile: good.toml}
    broken:
      hosts:
        gamma: {dflash_profile: sm120.toml}
"""


def _merge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_dflash.cli", "merge", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.heavy
def test_fleet_runs_hosts_in_parallel_one_broken_host_fails_alone(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_profile(tmp_path, "good", {"dflash": ("DFLASH", [])})
    write_profile(tmp_path, "sm120", {"dflash": ("DFLASH", ["--inject", "flashinfer-sm120"])})
    inventory = tmp_path / "fleet.yml"
    inventory.write_text(INVENTORY)
    reports: Path = run_suite.reports
    prom = tmp_path / "textfile" / "dflash.prom"

    started = time.monotonic()
    result = run_suite("smoke", "--fleet", str(inventory), "-n", "auto", "-v", "--gate", GATE,
                       "--prometheus", str(prom))
    elapsed = time.monotonic() - started
    assert_no_crash(result)
    assert result.ret == 1, result.stdout.str()[-3000:]

    # -n auto: hosts ran in parallel, each host's tests in one worker
    workers: dict[str, set[str]] = {}
    for worker, host in re.findall(r"\[(gw\d+)\] .*(?:PASSED|FAILED|SKIPPED|ERROR) \S+\[(alpha|beta|gamma)[/\]]",
                                   result.stdout.str()):
        workers.setdefault(host, set()).add(worker)
    assert set(workers) == {"alpha", "beta", "gamma"}, result.stdout.str()[-3000:]
    assert all(len(w) == 1 for w in workers.values()), workers
    if (os.cpu_count() or 1) >= 2:
        assert len(set().union(*workers.values())) >= 2, f"hosts did not run in parallel: {workers}"

    # one broken host, the others green: in the verdicts ...
    for host in ("alpha", "beta"):
        data = verdict(reports, host)
        assert data["verdict"] == "pass" and data["failures"] == [] and data["blocked"] == [], host
        assert {data["layers"][la]["outcome"] for la in ("host", "service", "generation")} == {"passed"}
    gamma = verdict(reports, "gamma")
    assert gamma["verdict"] == "fail"
    assert [gamma["layers"][la]["outcome"] for la in ("host", "service", "generation")] == [
        "passed", "failed", "blocked"]
    assert gamma["failures"][0]["diagnosis"][0]["id"] == "flashinfer-sm12x-nvcc"
    result.stdout.fnmatch_lines(["gate service,generation: FAILED on gamma; scope: smoke (1 of 8 suites)",
                                 "  gate failed: gamma service: 1 check(s) failed*[[]flashinfer-sm12x-nvcc[]]*",
                                 "fleet: 2/3 hosts pass"])
    assert [line for line in result.stdout.lines if line.startswith("gate ")] == [
        "gate service,generation: FAILED on gamma; scope: smoke (1 of 8 suites)"], \
        "one gate line, in the dflash verdict section"

    # ... the merged summary ...
    merged = tmp_path / "merged"
    merge = _merge(str(reports), "--out", str(merged), "--prometheus", str(tmp_path / "merged.prom"))
    assert merge.returncode == 1, merge.stderr  # the runs' gate (recorded in the verdicts) is not passed
    assert "fleet: 2/3 hosts pass" in merge.stdout and "gate service,generation: FAILED on gamma" in merge.stdout
    summary = json.loads((merged / "fleet-summary.json").read_text())
    assert {h: e["verdict"] for h, e in summary["hosts"].items()} == {"alpha": "pass", "beta": "pass",
                                                                       "gamma": "fail"}
    assert {h: {la: e["layers"][la] for la in ("host", "service", "generation")}
            for h, e in summary["hosts"].items()} == {
        "alpha": {"host": "passed", "service": "passed", "generation": "passed"},
        "beta": {"host": "passed", "service": "passed", "generation": "passed"},
        "gamma": {"host": "passed", "service": "failed", "generation": "blocked"}}
    assert "flashinfer-sm12x-nvcc" in summary["diagnoses"]
    assert {h for d in summary["diagnoses"].values() for h in d["hosts"]} == {"gamma"}
    assert summary["gate"]["failing"] == {"gamma": {"service": "failed", "generation": "blocked"}}
    in_run = json.loads((reports / "fleet-summary.json").read_text())  # written by the run itself
    assert {h: e["layers"] for h, e in in_run["hosts"].items()} == {h: e["layers"] for h, e in summary["hosts"].items()}
    page = (merged / "fleet-summary.html").read_text()
    assert '<article id="h-gamma">' in page and "flashinfer-sm12x-nvcc" in page

    # ... and the Prometheus file (the run's and the merge's) show exactly that
    assert parse(prom.read_text()) == parse((reports / "fleet.prom").read_text())
    for text in (prom.read_text(), (tmp_path / "merged.prom").read_text()):
        families = parse(text)
        assert {s["host"]: families["dflash_host_pass"].value(**s) for s in families["dflash_host_pass"].series()} == {
            "alpha": 1, "beta": 1, "gamma": 0}
        bad = {(s["host"], s["layer"], s["outcome"]) for s in families["dflash_layer_outcome"].series()
               if s["outcome"] != "passed"}
        # parity: skipped on every host, as "does not apply" (no [parity] table in these profiles)
        assert bad == {("gamma", "service", "failed"), ("gamma", "generation", "blocked"), ("gamma", "perf", "blocked"),
                       *((host, "parity", "skipped") for host in ("alpha", "beta", "gamma"))}
        assert {(s["host"], s["diagnosis"]) for s in families["dflash_failure_diagnosis"].series()} >= {
            ("gamma", "flashinfer-sm12x-nvcc")}
        assert {s["host"] for s in families["dflash_failure_diagnosis"].series()} == {"gamma"}
        assert families["dflash_fleet_gate_pass"].value(layers=GATE) == 0
        assert {s["host"] for s in families["dflash_service_ready_seconds"].series()} == {"alpha", "beta"}

    # --gate: non-zero for the broken host's layers, zero for layers it passed, zero when it is excluded
    assert _merge(str(reports), "--out", str(tmp_path / "g1"), "--gate", "host").returncode == 0
    excluded = _merge(str(reports), "--out", str(tmp_path / "g2"), "--gate", GATE, "--exclude", "gamma")
    assert excluded.returncode == 0 and "gate service,generation: PASSED" in excluded.stdout, excluded.stdout
    # (a gated run that passes exits 0: test_verdict_text_e2e's; an inventory group selects its hosts:
    # tests/config/test_inventory.py's)
    assert elapsed < 90, f"the fleet run took {elapsed:.0f}s"


def test_a_shards_summary_names_the_other_shards_hosts_not_interrupted(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One shard of a three-host fleet, at its end: its headline and fleet-summary.json say the two other hosts
    are in another shard. Before: "fleet: 0/3 hosts pass (2 interrupted)", and the JSON gave them stand-in
    'interrupted' verdicts with the connection "none: attached by URL"."""
    write_profile(tmp_path, "good", {"dflash": ("DFLASH", [])})
    write_profile(tmp_path, "sm120", {"dflash": ("DFLASH", ["--inject", "flashinfer-sm120"])})
    inventory = tmp_path / "fleet.yml"
    inventory.write_text(INVENTORY)
    result = run_suite("smoke", "--fleet", str(inventory), "--shard", "1/3", "-m", "service")
    assert_no_crash(result)
    summary = json.loads((run_suite.reports / "fleet-summary.json").read_text())
    (mine,) = summary["hosts"]
    others = sorted({"alpha", "beta", "gamma"} - {mine})
    assert summary["in_another_shard"] == others, summary["in_another_shard"]
    assert summary["totals"]["interrupted"] == 0 and summary["totals"]["hosts"] == 1
    out = result.stdout.str()
    assert f"2 hosts in another shard ({', '.join(others)}): the merge judges the fleet" in out, out[-3000:]
    assert "interrupted" not in out.split("dflash verdict", 1)[-1].lower(), out[-3000:]
    assert "attached by URL" not in (run_suite.reports / "fleet-summary.json").read_text()
