"""kind = "container" services for real: podman runs the refserver image; real pytest runs of the real suites.

The same scenario set as the systemd test host: healthy, start-up crash, death on the first sampled
request, OOM-killed by the container's memory limit (a container can enforce it, the test host could not),
restart loop, and that nothing the run created is left behind (`podman ps -a --filter label=…` empty).
"""

from __future__ import annotations

from pathlib import Path

from container_helpers import GUEST_PYTHON, containers_of, unique, write_profile
from support.pytest_runs import assert_no_crash, verdict


def test_healthy_container_passes_and_is_removed(run_suite, refserver_image: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--provision runs the profile's container (labelled with the run id), the smoke suite passes, teardown
    removes it."""
    host = unique("ct-ok")
    profile = write_profile(tmp_path, host, refserver_image, extra='restart = "no"\nshm_size = "64m"\nipc = "private"')
    result = run_suite("smoke", "--host", str(profile), "--provision")
    assert_no_crash(result)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert verdict(run_suite.reports, host)["verdict"] == "pass"
    assert containers_of(host) == []


def test_startup_crash_fails_with_the_container_log_and_exit_code(run_suite, refserver_image: str,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    """A server that exits at start-up ends readiness at once: its ExitCode and its log tail are in the failure."""
    host = unique("ct-crash")
    # An unknown flag: the refserver's argparse error, exit status 2, as SGLang's would be.
    profile = write_profile(tmp_path, host, refserver_image, args=["--no-such-flag"])
    result = run_suite("smoke", "--host", str(profile), "--provision")
    assert_no_crash(result)
    assert result.ret == 1
    text = result.stdout.str()
    assert "died during readiness" in text
    assert "ExitCode=2" in text
    assert "unrecognized arguments: --no-such-flag" in text  # from `podman logs`
    assert "Traceback (most recent call last)" not in text.split("unrecognized arguments")[0][-2000:]
    assert containers_of(host) == []


def test_death_on_first_sampled_request(run_suite, refserver_image: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--inject flashinfer-sm120: greedy works, the first sampled request kills the server (exit 137)."""
    host = unique("ct-sm120")
    profile = write_profile(tmp_path, host, refserver_image, args=["--inject", "flashinfer-sm120=1"],
                            extra='run_args = ["--init"]  # PID 1 cannot SIGKILL itself: catatonit is PID 1')
    result = run_suite("smoke", "--host", str(profile), "--provision")
    assert_no_crash(result)
    assert result.ret == 1
    text = result.stdout.str()
    assert "first sampled generation" in text
    assert "ExitCode=137" in text
    assert "FlashInfer requires GPUs with sm75 or higher" in text
    assert containers_of(host) == []


def test_oom_killed_by_the_memory_limit(run_suite, refserver_image: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """memory = "64m": the server's start-up allocation (96 MB standing in for weights) is killed by the kernel's
    cgroup OOM killer; inspect says OOMKilled, and the failure names it (and its diagnosis)."""
    host = unique("ct-oom")
    start = ("import runpy, sys; weights = b'w' * (96 << 20); "
             "sys.argv = ['sglang', '--host', '0.0.0.0', '--port', sys.argv[1]]; "
             "runpy.run_module('pytest_dflash.refserver', run_name='__main__')")
    profile = write_profile(tmp_path, host, refserver_image, algorithm="NONE",
                            command=[GUEST_PYTHON, "-c", start, "{port}"], extra='memory = "64m"')
    result = run_suite("smoke", "--host", str(profile), "--provision")
    assert_no_crash(result)
    assert result.ret == 1
    text = result.stdout.str()
    # podman 4.3 + runc on this machine's hybrid cgroups reports OOMKilled=false for a real OOM kill; the
    # kernel log names the container's memory cgroup, and the manager reads it from there.
    assert "OOMKilled=true" in text or "the kernel OOM-killed it" in text
    assert "Result=oom-kill" in text
    assert "Memory cgroup out of memory" in text or "oom-kill" in text
    assert containers_of(host) == []


def test_restart_loop_ends_readiness(run_suite, refserver_image: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """restart = "on-failure": the engine restarts a crashing server; readiness stops at the first death or
    restart instead of waiting out its budget."""
    host = unique("ct-loop")
    profile = write_profile(tmp_path, host, refserver_image, args=["--no-such-flag"], extra='restart = "on-failure"')
    result = run_suite("smoke", "--host", str(profile), "--provision", "--ready-timeout=60s")
    assert_no_crash(result)
    assert result.ret == 1
    text = result.stdout.str()
    assert "restart policy on-failure" in text or "restarted" in text, text[-3000:]
    assert "unrecognized arguments: --no-such-flag" in text
    assert containers_of(host) == []
