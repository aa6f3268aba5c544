"""The test host is a real, usable remote host: ssh + systemd + journal + HTTP from this machine,
an address that drops packets, and a teardown that leaves nothing behind.

Each test fails if the behaviour it names breaks. They run as root on a machine with the hybrid
cgroup layout (see docs/testhost.md); elsewhere they skip, or fail under DFLASH_REQUIRE_TESTHOST=1.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import testinfra
from testhost import (
    GUEST_CHECKOUT,
    GUEST_VENV,
    TestHost,
    down,
    exec_in_guest,
    leftovers,
    unused_ip,
)

pytestmark = pytest.mark.testhost

Factory = Callable[..., TestHost]


# --------------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(scope="module")
def host(testhost: TestHost) -> Any:
    """testinfra over the ssh binary, with the instance's ssh_config (pinned host key, key-only)."""
    return testinfra.get_host(testhost.ssh_target, ssh_config=str(testhost.ssh_config))


def wait_for(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def show(host: Any, unit: str) -> dict[str, str]:
    out = host.check_output(f"systemctl show -p ActiveState,SubState,Result,ExecMainStatus,NRestarts {unit}")
    return dict(line.split("=", 1) for line in out.splitlines())


@pytest.fixture
def unit(host: Any) -> Iterator[Callable[[str], str]]:
    """install(body) -> unit name: writes /etc/systemd/system/<unique>.service over ssh and
    reloads; the unit is stopped and removed after the test."""
    names: list[str] = []

    def install(body: str) -> str:
        name = f"dflash-t-{uuid.uuid4().hex[:8]}.service"
        b64 = base64.b64encode(body.encode()).decode()
        host.run_test(f"echo {b64} | base64 -d > /etc/systemd/system/{name} && systemctl daemon-reload")
        names.append(name)
        return name

    yield install
    for name in names:
        host.run(f"systemctl stop {name}; systemctl reset-failed {name}; rm -f /etc/systemd/system/{name}")
    if names:
        host.run("systemctl daemon-reload")


def journal(host: Any, unit: str) -> str:
    return str(host.check_output(f"journalctl -u {unit} --no-pager -n 200"))


# --------------------------------------------------------------------------------------------------
# a real host over ssh


def test_ssh_key_login_and_systemd_is_pid1(testhost: TestHost, host: Any) -> None:
    assert host.check_output("hostname") == testhost.name
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"
    assert host.check_output("systemctl is-system-running") in ("running", "degraded")
    assert host.service("ssh").is_running
    # the guest really is the other end of the veth, in its own network namespace
    assert f"inet {testhost.guest_ip}/24" in host.check_output("ip -4 -o addr show dev eth0")
    assert host.check_output("id -u") == "0"


def test_ssh_is_key_only(testhost: TestHost, tmp_path: Path) -> None:
    """Another key is refused (no password fallback): the instance key is the only way in."""
    other = tmp_path / "other_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    # -F /dev/null: the instance ssh_config would add the instance key; offer only `other`.
    res = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(other), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={testhost.state_dir / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
         "-o", "ConnectTimeout=3", f"root@{testhost.guest_ip}", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert res.returncode == 255
    assert "Permission denied (publickey)" in res.stderr


def test_exec_in_guest_nsenter_and_ssh(testhost: TestHost) -> None:
    vias: tuple[Literal["nsenter", "ssh"], ...] = ("nsenter", "ssh")
    for via in vias:
        res = exec_in_guest(testhost, "hostname && cat /proc/1/comm", via=via, timeout=30)
        assert (res.returncode, res.stdout.split()) == (0, [testhost.name, "systemd"]), via
    # the timeout kills the command, in the guest too
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        exec_in_guest(testhost, "sleep 31.5", timeout=1)
    assert time.monotonic() - t0 < 5
    assert exec_in_guest(testhost, "pgrep -f '^sleep 31.5'").returncode == 1


# --------------------------------------------------------------------------------------------------
# systemd: unit state, exit codes, restarts, journal


def test_failing_unit_reports_exit_code_and_journal(host: Any, unit: Callable[[str], str]) -> None:
    marker = f"dflash-marker-{uuid.uuid4().hex}"
    name = unit(f'[Service]\nExecStart=/bin/sh -c "echo {marker}; exit 3"\n')
    host.run_test(f"systemctl start {name}")
    wait_for(lambda: show(host, name)["ActiveState"] == "failed", 15, f"{name} to fail")
    props = show(host, name)
    assert (props["ActiveState"], props["SubState"], props["Result"], props["ExecMainStatus"]) == (
        "failed", "failed", "exit-code", "3",
    )  # fmt: skip
    wait_for(lambda: marker in journal(host, name), 10, "the unit's output in the journal")
    log = journal(host, name)
    assert "status=3" in log


def test_restart_on_failure_counts_restarts(host: Any, unit: Callable[[str], str]) -> None:
    name = unit('[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart=/bin/sh -c "sleep 0.2; exit 4"\n'
                "Restart=on-failure\nRestartSec=0.2\n")  # fmt: skip
    host.run_test(f"systemctl start {name}")

    def restarts() -> int:
        return int(show(host, name)["NRestarts"])

    wait_for(lambda: restarts() >= 1, 15, "a first restart")
    first = restarts()
    wait_for(lambda: restarts() >= first + 2, 15, "more restarts")
    later = restarts()
    assert later > first
    assert "status=4" in journal(host, name)


# --------------------------------------------------------------------------------------------------
# servers in the guest, reached from this machine


def wait_http(url: str, timeout: float, unit_failed: Callable[[], str | None]) -> httpx.Response:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError as e:
            last = e
        why = unit_failed()
        if why:
            raise AssertionError(why)
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout}s: {last!r}")


def _failed_with_journal(host: Any, name: str) -> Callable[[], str | None]:
    def check() -> str | None:
        p = show(host, name)
        if p["ActiveState"] in ("failed", "inactive"):
            return f"{name} is {p}:\n{journal(host, name)}"
        return None

    return check


def test_http_unit_reachable_from_host(testhost: TestHost, host: Any, unit: Callable[[str], str]) -> None:
    """A python3 http.server unit serving the read-only checkout answers on the guest address."""
    name = unit(
        f"[Service]\nExecStart=/usr/bin/python3 -m http.server 8000 --bind 0.0.0.0 --directory {GUEST_CHECKOUT}\n"
    )
    host.run_test(f"systemctl start {name}")
    r = wait_http(f"http://{testhost.guest_ip}:8000/pyproject.toml", 30, _failed_with_journal(host, name))
    assert r.status_code == 200
    assert r.content == (testhost.checkout / "pyproject.toml").read_bytes()


def test_checkout_read_only_on_venv_path_and_rootfs_untouched(testhost: TestHost) -> None:
    res = exec_in_guest(
        testhost, [f"{GUEST_VENV}/bin/python", "-c", "import pytest_dflash; print(pytest_dflash.__file__)"]
    )
    assert res.stdout.strip() == f"{GUEST_CHECKOUT}/pytest_dflash/__init__.py", res.stderr
    res = exec_in_guest(testhost, f"touch {GUEST_CHECKOUT}/dflash-write-probe")
    assert res.returncode != 0 and "Read-only file system" in res.stderr
    # guest writes land in the instance's tmpfs overlay, never in the shared cached rootfs
    probe = f"/etc/dflash-probe-{uuid.uuid4().hex[:8]}"
    assert exec_in_guest(testhost, f"echo x > {probe} && cat {probe}").stdout == "x\n"
    rootfs = Path(os.environ.get("DFLASH_TESTHOST_ROOTFS", "/var/lib/machines/pytest-dflash-bookworm"))
    assert not (rootfs / probe.lstrip("/")).exists()


REFSERVER_MAIN = Path(__file__).resolve().parents[2] / "pytest_dflash" / "refserver" / "__main__.py"


@pytest.mark.skipif(not REFSERVER_MAIN.exists(), reason="pytest_dflash/refserver/__main__.py not written yet")
def test_refserver_unit_answers_models(testhost: TestHost, host: Any, unit: Callable[[str], str]) -> None:
    """The checkout's refserver runs in the guest venv as a systemd unit and answers from here."""
    name = unit(
        f"[Service]\nExecStart={GUEST_VENV}/bin/python -m pytest_dflash.refserver --host 0.0.0.0 --port 30000\n"
    )
    host.run_test(f"systemctl start {name}")
    # torch's import alone takes seconds on 2 cores
    r = wait_http(f"http://{testhost.guest_ip}:30000/v1/models", 120, _failed_with_journal(host, name))
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body.get("data"), list) and body["data"], json.dumps(body)


# --------------------------------------------------------------------------------------------------
# unreachable host


def test_unused_ip_drops_packets(testhost: TestHost) -> None:
    ip = unused_ip(testhost)
    net = ipaddress.ip_network(f"{testhost.guest_ip}/24", strict=False)
    assert ipaddress.ip_address(ip) in net and ip not in (testhost.guest_ip, testhost.host_ip)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):  # a timeout: not refused, not "no route to host"
        socket.create_connection((ip, 22), timeout=4).close()
    assert 3.9 <= time.monotonic() - t0 < 5.5
    # and ssh's own connect timeout fires too (what a transport with ConnectTimeout sees)
    t0 = time.monotonic()
    res = subprocess.run(
        [*testhost.ssh_argv()[:-1], "-o", "ConnectTimeout=2", f"root@{ip}", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert res.returncode == 255 and "timed out" in res.stderr, res.stderr
    assert time.monotonic() - t0 < 5
    # while the guest itself answers at once
    socket.create_connection((testhost.guest_ip, 22), timeout=4).close()


# --------------------------------------------------------------------------------------------------
# lifecycle: isolation, teardown, killed runs, stale instances


def _assert_gone(th: TestHost) -> None:
    assert leftovers(th) == []
    # the same, checked with the system's own tools
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert th.name not in netns.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10).stdout
    assert th.veth not in links
    assert not list(Path("/sys/fs/cgroup").glob(f"*/ci-{th.name}"))
    assert not th.state_dir.exists()
    ps = subprocess.run(["ps", "-eo", "pid,cgroup"], capture_output=True, text=True, timeout=10).stdout
    assert f"/ci-{th.name}/" not in ps


def test_down_leaves_nothing_behind(testhost: TestHost, testhost_factory: Factory) -> None:
    th = testhost_factory()
    assert exec_in_guest(th, "systemctl is-system-running").stdout.strip() in ("running", "degraded")
    assert th.guest_ip != testhost.guest_ip
    # nothing is routed beyond an instance's own veth: it cannot reach another instance
    res = exec_in_guest(th, f"timeout 3 bash -c '</dev/tcp/{testhost.guest_ip}/22'")
    assert res.returncode != 0 and "unreachable" in res.stderr, res.stderr
    down(th)
    _assert_gone(th)
    down(th)  # idempotent
    _assert_gone(th)


def test_down_after_nspawn_was_killed(testhost_factory: Factory) -> None:
    """SIGKILL to nspawn orphans the guest's systemd; down still powers it off and cleans up."""
    th = testhost_factory()
    os.kill(th.nspawn_pid, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{th.nspawn_pid}").exists(), 5, "nspawn to die")
    assert Path(f"/proc/{th.leader_pid}").exists(), "guest PID 1 should outlive nspawn (the orphan case)"
    down(th)
    _assert_gone(th)


def test_up_reaps_instances_of_dead_owners(testhost_factory: Factory) -> None:
    owner = subprocess.Popen(["sleep", "120"])
    try:
        stale = testhost_factory(owner_pid=owner.pid)
    finally:
        owner.kill()
        owner.wait(timeout=10)
    assert leftovers(stale), "instance should still be up before the next up"
    testhost_factory()  # reaps `stale` before it creates its own
    _assert_gone(stale)


def _nsenters_into(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "comm").read_text().strip() == "nsenter"
                and f"\0-t\0{pid}\0" in (proc / "cmdline").read_text()
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _like_a_background_job() -> None:
    # what a non-interactive shell (CI's .ci/run) gives its background jobs and their children
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def test_down_with_a_command_left_in_the_guest(testhost_factory: Factory) -> None:
    """A killed run can leave a command entered with nsenter running in the guest. With SIGINT and
    SIGQUIT ignored (as in a background job of a shell script), the guest's systemd-shutdown then
    waits ~60 s for it while its nsenter stops itself for good and stays on this machine. down
    must kill such commands first: fast poweroff, no stopped nsenter left."""
    th = testhost_factory()
    entered = subprocess.Popen(
        ["nsenter", "-t", str(th.leader_pid), "-m", "-u", "-i", "-n", "-p", "-C", "-r", "-w", "--",
         "sleep", "307"],
        start_new_session=True, stdin=subprocess.DEVNULL, preexec_fn=_like_a_background_job,
    )  # fmt: skip
    try:
        wait_for(lambda: exec_in_guest(th, "pgrep -x sleep").returncode == 0, 15, "the entered command")
        t0 = time.monotonic()
        down(th)
        assert time.monotonic() - t0 < 10
        assert entered.wait(timeout=10) != 0
        assert _nsenters_into(th.leader_pid) == []
    finally:
        if entered.poll() is None:
            entered.kill()
            entered.wait(timeout=10)
    _assert_gone(th)
