"""xdist as users run it (issue 31, item 4): under `-n` test ids are pytest's own, and a crashed worker never
hangs a run, even its only one. Real pytest runs in subprocesses with a timeout (a hang fails the test)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from e2e_helpers import SUITES, write_profile
from support.pytest_runs import EXTERNAL_DFLASH_PROFILE, verdict

KILL_ONCE = """
import os, pathlib, signal

def pytest_runtest_call(item):
    flag = pathlib.Path(__file__).with_name("killed-once")
    if item.name.startswith("test_greedy_generation") and not flag.exists():
        flag.write_text("x")
        os.kill(os.getpid(), signal.SIGKILL)
"""


def _pytest(cwd: Path, *args: str, timeout_s: float = 240,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A pytest run in its own session: past `timeout_s` it fails the test (a hang), and its whole process group
    (workers, servers) is killed."""
    cmd = [sys.executable, "-m", "pytest", "--request-timeout=20s", *args]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"the run hung: still running after {timeout_s:g}s\n{out[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.heavy
def test_with_one_worker_a_killed_worker_ends_the_run_interrupted(tmp_path: Path) -> None:
    """`-n 1`, the worker SIGKILLed in test_greedy_generation: before, xdist's loadgroup sent the replacement
    an empty unit and the run hung after "replacing crashed worker gw0"."""
    (tmp_path / "conftest.py").write_text(KILL_ONCE)
    (tmp_path / "test_smoke.py").write_text((SUITES / "smoke" / "test_smoke.py").read_text())
    profile = write_profile(tmp_path, "killed", {"plain": ("NONE", [])})
    result = _pytest(tmp_path, "-p", "no:cacheprovider", "test_smoke.py", "--host", str(profile), "-n", "1",
                     f"--dflash-report={tmp_path / 'reports'}", timeout_s=180)
    out = result.stdout
    assert "replacing crashed worker gw0" in out, out[-3000:]
    assert result.returncode == 1, out[-3000:]
    assert "FAILED test_smoke.py::test_greedy_generation[killed/plain] - worker 'gw0' cra" in out, out[-3000:]
    assert "@" not in out.split("short test summary info")[-1]
    data = verdict(tmp_path / "reports", "killed")
    assert data["verdict"] == "interrupted", data
    # every test reported once: the others ran before the crash or on the replacement; the crashed one is
    # xdist's crash report, not run again
    collected = int(re.search(r"\[(\d+) items\]", out).group(1))  # type: ignore[union-attr]
    counts = re.findall(r"(\d+) (?:passed|failed|skipped)", out.splitlines()[-1])
    assert sum(map(int, counts)) == collected, out[-3000:]


FLEET_TEST = """
import os
import pytest

@pytest.mark.host
@pytest.mark.parametrize("step", [0, 1])
def test_host(dflash_host, step):
    assert not (dflash_host.name == os.environ["BROKEN_HOST"] and step == 1), "host check failed"

def test_plain():
    pass
"""
PROFILE = EXTERNAL_DFLASH_PROFILE


def _junit_names(path: Path) -> list[str]:
    return sorted(f"{case.get('classname')}::{case.get('name')}" for case in ET.parse(path).iter("testcase"))


def _failed_lines(out: str) -> list[str]:
    return sorted(line.split(" - ")[0] for line in out.splitlines() if line.startswith("FAILED "))


def test_ids_under_xdist_are_the_ids_without_it(tmp_path: Path) -> None:
    """JUnit names and FAILED lines are the same with and without `-n 2`, and `--lf` after a `-n` run re-runs
    exactly the failed test (before: `test_host[gpu-b-1]@gpu-b`, which pytest cannot find)."""
    (tmp_path / "test_fleet_ids.py").write_text(FLEET_TEST)
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        (fleet / f"{name}.toml").write_text(PROFILE)
    args = ("--fleet", str(fleet), f"--dflash-report={tmp_path / 'reports'}")
    env = {"BROKEN_HOST": "gpu-b"}
    plain = _pytest(tmp_path, "-p", "no:cacheprovider", *args, "--junitxml=plain.xml", env=env)
    grouped = _pytest(tmp_path, "-p", "no:cacheprovider", *args, "-n", "2", "--dist", "loadgroup",
                      "--junitxml=grouped.xml", env=env)
    spread = _pytest(tmp_path, *args, "-n", "2", "--junitxml=spread.xml", env=env)
    failures = verdict(tmp_path / "reports", "gpu-b")["failures"]
    again = _pytest(tmp_path, *args, "--lf", "-v", env=env)
    for result in (plain, grouped, spread, again):
        assert "INTERNALERROR" not in result.stdout + result.stderr, result.stdout[-3000:]
        assert result.returncode == 1, result.stdout[-3000:]
    assert _junit_names(tmp_path / "spread.xml") == _junit_names(tmp_path / "plain.xml")
    assert _junit_names(tmp_path / "grouped.xml") == _junit_names(tmp_path / "plain.xml")  # --dist loadgroup too
    assert not any("@" in name for name in _junit_names(tmp_path / "spread.xml"))
    assert _failed_lines(spread.stdout) == _failed_lines(grouped.stdout) == _failed_lines(plain.stdout) == [
        "FAILED test_fleet_ids.py::test_host[gpu-b-1]"], spread.stdout[-3000:]
    assert [failure["test"] for failure in failures] == ["test_fleet_ids.py::test_host[gpu-b-1]"], failures
    ran = [line.split(" ")[0] for line in again.stdout.splitlines() if line.startswith("test_fleet_ids.py::")]
    assert ran == ["test_fleet_ids.py::test_host[gpu-b-1]"], again.stdout[-3000:]
