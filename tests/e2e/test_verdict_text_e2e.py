"""What the terminal says at the end of a run is what the verdict says: a gate that ignored a failure outside its
layers says so in its one line, and a shard that holds no host says it tested none of the fleet's N hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import write_profile
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.config.inventory import shard_of


@pytest.mark.heavy
def test_a_gate_says_what_it_ignored_once(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two hosts, one serving a random draft (its drafts are never accepted: smoke's perf check fails), gated on
    service,generation: exit 0 as docs/gating.md says, and ONE gate line that names the failure outside the
    gate (before: 'gate service,generation: PASSED' twice, the fleet headline's and the verdict section's)."""
    steady = write_profile(tmp_path, "steady", {"dflash": ("DFLASH", [])})
    random = write_profile(tmp_path, "randdraft", {"dflash": ("DFLASH", ["--random-draft"])})
    result = run_suite("smoke", "--host", str(steady), "--host", str(random), "--gate", "service,generation")
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert verdict(run_suite.reports, "randdraft")["verdict"] == "fail"
    gate_lines = [line for line in result.stdout.lines if line.startswith("gate ")]
    assert gate_lines == ["gate service,generation: PASSED; scope: smoke (1 of 8 suites); outside the gate: "
                          "randdraft perf failed"], gate_lines
    assert verdict(run_suite.reports, "steady")["gate"]["outside"] == ["randdraft perf failed"]


def _fleet_of_one(tmp_path: Path) -> tuple[Path, int]:
    """A fleet folder with one host, and the shard of two that does not hold it."""
    name = next(n for n in (f"lonely{i}" for i in range(100)) if shard_of(n, 2) == 2)
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    write_profile(fleet, name, {"plain": ("NONE", [])})
    return fleet, 1


@pytest.mark.parametrize(("gate", "code"), [((), 0), (("--gate", "service"), 1)], ids=["no-gate", "gated"])
def test_an_empty_shard_says_it_holds_none_of_the_fleet(run_suite, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                        gate: tuple[str, ...], code: int) -> None:
    """`--shard 1/2` of a one-host fleet whose host is in shard 2/2: it says it holds 0 of 1 host and where the
    host is. Without --gate exit 0 (a CI matrix wider than its fleet; the merge is the fleet's verdict); with
    --gate exit 1: a gate over no host never opens (before: '0 selected', exit 0, either way)."""
    fleet, empty = _fleet_of_one(tmp_path)
    result = run_suite("smoke", "--fleet", str(fleet), "--shard", f"{empty}/2", *gate)
    assert_no_crash(result)
    assert result.ret == code, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([f"shard {empty}/2 holds 0 of 1 host (all in shard 2/2): no host was tested by "
                                 "this run; the fleet's verdict is `pytest-dflash merge` over every shard's "
                                 "verdicts"])
    if gate:
        result.stdout.fnmatch_lines(["gate service: FAILED: this shard holds no host, and a gate over no host "
                                     "never opens"])
