"""Python API for the pytest-dflash test host: systemd (PID 1) + sshd in its own network namespace.

The shell scripts next to this file do the work (``build.sh``, ``up.sh``, ``down.sh``); this module
runs them with timeouts and describes an instance as a :class:`TestHost`. Every subprocess call has
a timeout and is killed with its whole process group when it runs over.

Typical use (what the ``testhost`` fixture in ``testhost_plugin.py`` does)::

    reason = can_run()          # None, or why this machine cannot run a test host
    build()                     # cached: < 1 s when the rootfs and venv are current
    th = up()                   # ~1 s
    host = testinfra.get_host(th.ssh_target, ssh_config=str(th.ssh_config))
    down(th)                    # ~2 s
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Literal

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
UP_SH = HERE / "up.sh"
DOWN_SH = HERE / "down.sh"
LIB_SH = HERE / "lib.sh"

#: The checkout that up.sh bind-mounts read-only at /opt/pytest-dflash in the guest by default.
CHECKOUT = HERE.parent.parent
GUEST_VENV = "/opt/dflash-venv"
GUEST_CHECKOUT = "/opt/pytest-dflash"

#: Environment of commands run in the guest through nsenter (the host's must not leak in).
_GUEST_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root")


def rootfs() -> Path:
    return Path(os.environ.get("DFLASH_TESTHOST_ROOTFS", "/var/lib/machines/pytest-dflash-bookworm"))


def rundir() -> Path:
    return Path(os.environ.get("DFLASH_TESTHOST_RUNDIR", "/run/pytest-dflash-testhost"))


class TestHostError(RuntimeError):
    """A script failed; the message carries the tail of its output."""

    __test__: ClassVar[bool] = False


@dataclass(frozen=True)
class TestHost:
    """One running instance, as recorded in its state dir by up.sh."""

    __test__: ClassVar[bool] = False  # not a test class, although its name starts with "Test"

    name: str
    guest_ip: str
    host_ip: str
    ssh_config: Path
    identity_file: Path
    state_dir: Path
    leader_pid: int  # the guest's PID 1 (systemd), as seen from this machine
    leader_start: str  # its start time (/proc/PID/stat field 22): guards against PID reuse
    nspawn_pid: int
    veth: str  # host side of the veth pair
    blackhole_ip: str  # see unused_ip()
    cgroups: tuple[Path, ...]
    checkout: Path  # bind-mounted read-only at /opt/pytest-dflash in the guest
    up_seconds: float | None = None

    @property
    def ssh_target(self) -> str:
        """Host spec for testinfra (``testinfra.get_host(th.ssh_target, ssh_config=str(th.ssh_config))``)
        and for ``--hosts``; the ssh_config maps the name to the guest address, key and pinned host key."""
        return f"ssh://{self.name}"

    def ssh_argv(self, command: str | None = None) -> list[str]:
        """``ssh`` argv for this instance (BatchMode, pinned host key, per-instance key)."""
        argv = ["ssh", "-F", str(self.ssh_config), self.name]
        return [*argv, command] if command is not None else argv

    @classmethod
    def from_state_dir(cls, state_dir: str | os.PathLike[str]) -> TestHost:
        sd = Path(state_dir)
        env = read_state(sd)
        missing = [k for k in ("NAME", "GUEST_IP", "HOST_IP", "LEADER_PID", "NSPAWN_PID", "VETH") if k not in env]
        if missing:
            raise TestHostError(f"{sd}: not a booted test-host instance (missing {', '.join(missing)})")
        cg_file = sd / "cgroups"
        cgroups = tuple(Path(p) for p in cg_file.read_text().split()) if cg_file.exists() else ()
        up_s = env.get("UP_SECONDS")
        return cls(
            name=env["NAME"],
            guest_ip=env["GUEST_IP"],
            host_ip=env["HOST_IP"],
            ssh_config=Path(env.get("SSH_CONFIG", sd / "ssh_config")),
            identity_file=Path(env.get("IDENTITY", sd / "id_ed25519")),
            state_dir=sd,
            leader_pid=int(env["LEADER_PID"]),
            leader_start=env.get("LEADER_START", ""),
            nspawn_pid=int(env["NSPAWN_PID"]),
            veth=env["VETH"],
            blackhole_ip=env["BLACKHOLE_IP"],
            cgroups=cgroups,
            checkout=Path(env.get("CHECKOUT", CHECKOUT)),
            up_seconds=float(up_s) if up_s else None,
        )


def read_state(state_dir: Path) -> dict[str, str]:
    """KEY=VALUE lines of ``<state_dir>/instance.env`` (a later line wins)."""
    env: dict[str, str] = {}
    for line in (state_dir / "instance.env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return env


# --------------------------------------------------------------------------------------------------
# subprocess with a timeout that kills the whole process group (nsenter forks, ssh may linger)


def _run(
    argv: Sequence[str],
    *,
    timeout: float,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env) if env is not None else None,
        # own session: a timeout (or Ctrl-C in pytest) kills the group, and the child never
        # receives the terminal's SIGINT by itself, half-way through a teardown.
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:  # TimeoutExpired, KeyboardInterrupt, ...
        _kill_group(proc)
        raise
    res = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
    if check and res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, res.args, out, err)
    return res


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=5)


def _script(argv: Sequence[str], *, timeout: float, log: Callable[[str], None] | None = None) -> tuple[str, float]:
    """Run one of our scripts; returns (stdout, seconds). stderr (the step log) goes to ``log``."""
    t0 = time.monotonic()
    try:
        res = _run(argv, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise TestHostError(f"{Path(argv[0]).name} ran over {timeout:g}s") from e
    secs = time.monotonic() - t0
    if log is not None:
        for line in res.stderr.splitlines():
            log(line)
    if res.returncode != 0:
        tail = "\n".join((res.stderr + res.stdout).splitlines()[-30:])
        raise TestHostError(f"{Path(argv[0]).name} failed (exit {res.returncode}):\n{tail}")
    return res.stdout, secs


# --------------------------------------------------------------------------------------------------
# public API


def can_run() -> str | None:
    """None when this machine can build and boot a test host, else the reason it cannot."""
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    if os.geteuid() != 0:
        return f"not root (uid {os.geteuid()}): netns, cgroups and systemd-nspawn need root"
    for tool in ("ip", "nsenter", "unshare", "flock", "setsid", "chroot", "bash"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if not Path("/proc/self/ns/net").exists() or not Path("/proc/self/ns/cgroup").exists():
        return "kernel without network or cgroup namespaces"
    # Host packages: build.sh installs them with apt-get when they are missing.
    needs = [t for t in ("systemd-nspawn", "debootstrap", "ssh", "ssh-keygen") if shutil.which(t) is None]
    if needs and shutil.which("apt-get") is None:
        return f"{'/'.join(needs)} missing and no apt-get to install them"
    # The one cgroup layout this recipe is tested on; lib.sh says why another one is refused.
    try:
        res = _run(["bash", "-c", 'source "$1" && cgroup_roots', "bash", str(LIB_SH)], timeout=10)
    except subprocess.TimeoutExpired:
        return "cgroup layout probe timed out"
    if res.returncode != 0:
        return f"unsupported cgroup layout: {res.stderr.strip() or res.returncode}"
    return None


def build(*, timeout: float = 1800.0, force_venv: bool = False, log: Callable[[str], None] | None = None) -> float:
    """Build (or reuse) the cached rootfs + guest venv; returns the seconds it took.

    Cold: ~1.5 min on 2 cores (debootstrap ~1 min, venv ~35 s); cached: well under a second.
    Safe to call from parallel processes (build.sh holds a flock)."""
    argv = [str(BUILD_SH), *(["--force-venv"] if force_venv else [])]
    return _script(argv, timeout=timeout, log=log)[1]


def up(
    *,
    name: str | None = None,
    owner_pid: int | None = None,
    subnet: str | None = None,
    checkout: str | os.PathLike[str] | None = None,
    timeout: float = 240.0,
    log: Callable[[str], None] | None = None,
) -> TestHost:
    """Boot an instance and return it once ssh works and systemd reports running/degraded.

    ``owner_pid`` (default: this process): when it dies, the instance counts as stale and the
    next ``up`` (or ``down.sh --stale``) removes it. On any failure, or when interrupted, what this
    call created is torn down again before the exception propagates."""
    name = name or f"dfl-{secrets.token_hex(3)}"
    owner = os.getpid() if owner_pid is None else owner_pid
    argv = [str(UP_SH), "--name", name, "--owner", str(owner)]
    if subnet:
        argv += ["--subnet", subnet]
    if checkout is not None:
        argv += ["--checkout", os.fspath(checkout)]
    state_dir = rundir() / name
    try:
        out, secs = _script(argv, timeout=timeout, log=log)
    except BaseException:
        # up.sh cleans up after its own failures; this covers it being killed (timeout, Ctrl-C).
        # Only an instance recorded as owned by `owner` is ours: a name clash made up.sh stop
        # before it created anything, and the other instance of that name is left alone.
        try:
            ours = read_state(state_dir).get("OWNER_PID") == str(owner)
        except OSError:  # nothing recorded (or up.sh already removed it)
            ours = False
        if ours:
            _run([str(DOWN_SH), str(state_dir)], timeout=180)
        raise
    m = re.search(r"^DFLASH_TESTHOST_STATE=(.+)$", out, re.M)
    if not m:
        raise TestHostError(f"up.sh printed no state dir:\n{out}")
    th = TestHost.from_state_dir(m.group(1))
    return th if th.up_seconds is not None else replace(th, up_seconds=round(secs, 2))


def attach(state_dir: str | os.PathLike[str]) -> TestHost:
    """An instance somebody else brought up (``DFLASH_TESTHOST_STATE``); checked to be running."""
    th = TestHost.from_state_dir(state_dir)
    if not _leader_is_ours(th):
        raise TestHostError(f"test host {th.name} ({state_dir}) is not running (guest PID 1 gone)")
    return th


def down(th: TestHost | str | os.PathLike[str], *, timeout: float = 180.0) -> float:
    """Stop an instance and remove everything it created; returns seconds. Idempotent."""
    state_dir = th.state_dir if isinstance(th, TestHost) else Path(th)
    return _script([str(DOWN_SH), str(state_dir)], timeout=timeout)[1]


def unused_ip(th: TestHost) -> str:
    """An address in the instance's subnet that nobody answers: a TCP connect to it times out.

    up.sh gives it a permanent neighbour entry with a MAC that nobody has, so packets go down the
    instance's veth and are dropped by the guest's NIC, like a host behind a dropping firewall
    (without it, a failed ARP would end the connect early with EHOSTUNREACH). Traffic to it never
    leaves the instance's veth pair."""
    return th.blackhole_ip


def exec_in_guest(
    th: TestHost,
    cmd: str | Sequence[str],
    *,
    timeout: float = 60.0,
    via: Literal["nsenter", "ssh"] = "nsenter",
    check: bool = False,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (a shell string, or an argv) in the guest; the process group is killed on timeout.

    ``nsenter`` enters the guest's namespaces from this machine (works without sshd; the command
    runs with a clean guest environment); ``ssh`` goes through the guest's sshd like a user would."""
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    if via == "ssh":
        full = th.ssh_argv(cmd if isinstance(cmd, str) else shlex.join(argv))
    else:
        if not _leader_is_ours(th):  # a recycled PID must never be entered
            raise TestHostError(f"guest PID 1 of {th.name} ({th.leader_pid}) is gone")
        full = ["nsenter", "-t", str(th.leader_pid), "-m", "-u", "-i", "-n", "-p", "-C", "-r", "-w",
                "--", "/usr/bin/env", "-i", *_GUEST_ENV, *argv]  # fmt: skip
    return _run(full, timeout=timeout, input=input, check=check)


def leftovers(th: TestHost) -> list[str]:
    """What of the instance still exists on this machine (empty after a complete ``down``)."""
    found: list[str] = []
    if th.state_dir.exists():
        found.append(f"state dir {th.state_dir}")
    if Path("/run/netns", th.name).exists():
        found.append(f"netns {th.name}")
    if Path("/sys/class/net", th.veth).exists():
        found.append(f"veth {th.veth}")
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/ci-{th.name}")]
    if _leader_is_ours(th):
        found.append(f"guest PID 1 {th.leader_pid}")
    if _pid_alive(th.nspawn_pid) and _comm(th.nspawn_pid) == "systemd-nspawn":
        found.append(f"systemd-nspawn {th.nspawn_pid}")
    marker = f"/ci-{th.name}/"
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cgroup").read_text():
                    found.append(f"process {proc.name} ({_comm(int(proc.name))}) in {marker}")
            except OSError:
                continue
    return found


def instances() -> list[Path]:
    """State dirs of all instances on this machine (any owner)."""
    rd = rundir()
    return sorted(p for p in rd.iterdir() if p.is_dir()) if rd.exists() else []


# --------------------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _starttime(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(") ", 1)[1].split()[19]


def _leader_is_ours(th: TestHost) -> bool:
    """The recorded guest PID 1 still runs, is the same process, and sits in our cgroup."""
    if not th.leader_start or _starttime(th.leader_pid) != th.leader_start:
        return False
    try:
        return f"/ci-{th.name}/payload" in Path(f"/proc/{th.leader_pid}/cgroup").read_text()
    except OSError:
        return False
