"""Helpers for the scenario tests (``test_remote_*.py``): real pytest runs of the real suites, through
the plugin, against the test host's systemd over ssh.

- :func:`write_profile` writes a host profile (``ssh://root@<guest>`` + the instance's ssh_config)
  whose services are refservers run as systemd units from ``units/*.service``.
- :class:`SuiteRun` runs ``pytest suites/...`` in a subprocess of its own session (it can be
  SIGKILLed, run next to another one, and nothing it starts outlives the test).
- :class:`Guest` looks at the guest from outside the plugin (nsenter, not the plugin's ssh): unit
  properties, unit files, the journal, processes, the host lock.

Every subprocess and guest command has a timeout; every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testhost import GUEST_VENV, TestHost, exec_in_guest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SUITES = ROOT / "suites"
UNITS = HERE / "units"
GUEST_PYTHON = f"{GUEST_VENV}/bin/python"
UNIT_DIR = "/etc/systemd/system"
REMOTE_LOCK = "/run/lock/pytest-dflash.lock"
REMOTE_OWNER = "/run/lock/pytest-dflash.owner"
REFSERVER_ARGS = {"NONE": "", "DFLASH": "--speculative-num-draft-tokens 8",
                  "DDTREE": "--speculative-num-draft-tokens 8 --speculative-ddtree-budget 32"}
RECORDER = "dflash_scenario_recorder"
MARKER_KEY = "X-PytestDflash-Run"


def unit_name(tag: str) -> str:
    """A unit name unique to one test (tests share the session's guest)."""
    return f"dflash-{tag}-{secrets.token_hex(3)}.service"


def guest_port() -> int:
    return random.randint(31000, 39999)


@dataclass
class RefUnit:
    """One service of a scenario profile: a refserver run by systemd in the guest."""

    unit: str
    algorithm: str = "DFLASH"
    args: str = ""  # refserver flags after the algorithm's own (e.g. "--inject oom-kill=3")
    restart: str = "no"
    restart_sec: str = "1"
    template: str = "refserver.service"
    port: int = field(default_factory=guest_port)
    env: Mapping[str, str] = field(default_factory=dict)
    vars: Mapping[str, str] = field(default_factory=dict)
    api_key_env: str | None = None
    ready_timeout: str = "60s"
    gpus: tuple[int, ...] = ()  # the profile's gpus (its unit's CUDA_VISIBLE_DEVICES)

    def all_vars(self) -> dict[str, str]:
        args = f"{REFSERVER_ARGS[self.algorithm]} {self.args}".strip()
        return {"algorithm": self.algorithm, "args": args, "restart": self.restart,
                "restart_sec": self.restart_sec, **self.vars}


def _toml(value: str) -> str:
    return json.dumps(value)


def write_profile(directory: Path, th: TestHost, name: str, services: Mapping[str, RefUnit], *,
                  address: str | None = None, parity: tuple[str, Sequence[str]] | None = None,
                  user: str = "root", become: bool = False) -> Path:
    """A host profile for the test host: ssh://<user>@<address> with the instance's ssh_config, the
    venv python of the guest, and one systemd service per `services` entry. `address` (default:
    the guest's) is where ssh goes; the services' URLs always name the guest. `user` other than root:
    one of the guest's unprivileged users (build.sh: dflash, dflash-pw), with `become`: root's
    commands go through `sudo -n`."""
    lines = ["[host]", f"connection = {_toml(f'ssh://{user}@{address or th.guest_ip}?timeout=4')}",
             f"ssh_config = {_toml(str(th.ssh_config))}", f"python = {_toml(GUEST_PYTHON)}"]
    if become:
        lines.append("become = true")
    lines.append("")
    for service, spec in services.items():
        lines += [f"[services.{service}]", 'kind = "systemd"', f"unit = {_toml(spec.unit)}",
                  f"template = {_toml(str(UNITS / spec.template))}", f"algorithm = {_toml(spec.algorithm)}",
                  f"url = {_toml(f'http://{th.guest_ip}:{spec.port}')}", f"port = {spec.port}",
                  f"ready_timeout = {_toml(spec.ready_timeout)}", 'sampled_timeout = "30s"',
                  "structured_output = false"]  # the guest has no xgrammar: its units say --grammar-backend none
        if spec.api_key_env:
            lines.append(f"api_key_env = {_toml(spec.api_key_env)}")
        if spec.gpus:
            lines.append(f"gpus = {json.dumps(list(spec.gpus))}")
        lines += ["", f"[services.{service}.vars]", *(f"{k} = {_toml(v)}" for k, v in spec.all_vars().items()), ""]
        if spec.env:
            lines += [f"[services.{service}.env]", *(f"{k} = {_toml(v)}" for k, v in spec.env.items()), ""]
    if parity:
        reference, compared = parity
        lines += ["[parity]", f"reference = {_toml(reference)}", f"compare = {json.dumps(list(compared))}", ""]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines))
    return path


def render_unit(spec: RefUnit, service: str = "svc") -> str:
    """The unit text the plugin would install for `spec` (for attach-mode scenarios, where the test
    itself installs and starts the unit, without the plugin's run marker)."""
    text = (UNITS / spec.template).read_text()
    values = {"python": GUEST_PYTHON, "port": str(spec.port), "service": service, **spec.all_vars()}
    return re.sub(r"(?<!\$)\{([a-z_]+)\}", lambda m: values[m.group(1)], text)


# --------------------------------------------------------------------------------------------------
# the guest, seen from outside the plugin


@dataclass
class Guest:
    """Reads (and, for test setup, changes) the guest through nsenter: never through the plugin's ssh."""

    th: TestHost
    units: list[str] = field(default_factory=list)  # removed by cleanup(), whatever happened

    def track(self, *units: str) -> None:
        self.units.extend(units)

    def cleanup(self) -> None:
        self.remove_units(self.units)

    def sh(self, command: str, *, timeout: float = 30, check: bool = True) -> str:
        res = exec_in_guest(self.th, command, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"guest: `{command}` exited {res.returncode}: {res.stderr.strip()[-500:]}")
        return res.stdout

    def show(self, unit: str, *props: str) -> dict[str, str]:
        names = ",".join(props or ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus",
                                   "NRestarts"))
        out = self.sh(f"systemctl show -p {names} {shlex.quote(unit)}")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def is_active(self, unit: str) -> str:
        return self.sh(f"systemctl is-active {shlex.quote(unit)}", check=False, timeout=10).strip()

    def unit_file_exists(self, unit: str) -> bool:
        return exec_in_guest(self.th, ["test", "-e", f"{UNIT_DIR}/{unit}"], timeout=10).returncode == 0

    def unit_files(self) -> list[str]:
        return self.sh(f"ls {UNIT_DIR}").split()

    def refservers(self) -> list[str]:
        """Command lines of refserver processes running in the guest ([.] keeps pgrep from matching itself)."""
        res = exec_in_guest(self.th, ["pgrep", "-af", "pytest_dflash[.]refserver"], timeout=10)
        return res.stdout.splitlines()

    def journal(self, unit: str, *, since: float | None = None) -> list[dict[str, Any]]:
        """The unit's journal entries (``journalctl -o json``), oldest first."""
        argv = ["journalctl", "-u", unit, "-o", "json", "--no-pager"]
        if since is not None:
            argv += ["--since", f"@{since:.3f}"]
        res = exec_in_guest(self.th, argv, timeout=30)
        return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]

    def journal_text(self, unit: str) -> str:
        return "\n".join(str(e.get("MESSAGE", "")) for e in self.journal(unit))

    def exit_times(self, unit: str) -> list[float]:
        """When systemd logged the death of the unit's main process ("Main process exited"), epoch s."""
        return [int(e["__REALTIME_TIMESTAMP"]) / 1e6 for e in self.journal(unit)
                if "Main process exited" in str(e.get("MESSAGE", ""))]

    def lock_is_free(self) -> bool:
        res = exec_in_guest(self.th, ["flock", "-n", REMOTE_LOCK, "true"], timeout=10)
        return res.returncode == 0

    def lock_owner(self) -> str:
        return self.sh(f"cat {REMOTE_OWNER} 2>/dev/null || true").strip()

    def install_unit(self, unit: str, text: str) -> None:
        """Test setup for attach mode: write the unit, reload, start it (the plugin never does this in attach)."""
        exec_in_guest(self.th, ["sh", "-c", f"cat > {UNIT_DIR}/{unit} && systemctl daemon-reload"], input=text,
                      timeout=30, check=True)
        self.sh(f"systemctl start {shlex.quote(unit)}")

    def remove_units(self, units: Sequence[str]) -> None:
        """Stop and remove units a test created or provisioned (whatever state the run left them in)."""
        if not units:
            return
        quoted = " ".join(shlex.quote(u) for u in units)
        files = " ".join(shlex.quote(f"{UNIT_DIR}/{u}") for u in units)
        self.sh(f"systemctl stop {quoted}; rm -f {files}; systemctl daemon-reload; systemctl reset-failed {quoted}",
                check=False, timeout=90)

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(step)


class Sampler:
    """Samples `systemctl is-active UNIT` in the guest every `every` s in a thread: [(epoch s, state)]."""

    def __init__(self, guest: Guest, unit: str, every: float = 0.1) -> None:
        self.guest, self.unit, self.every = guest, unit, every
        self.samples: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sample-{unit}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(subprocess.TimeoutExpired):
                state = self.guest.is_active(self.unit)
                self.samples.append((time.time(), state))
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


# --------------------------------------------------------------------------------------------------
# pytest runs of the real suites


@dataclass
class Outcome:
    rc: int
    out: str
    seconds: float
    reports: Path
    events_path: Path

    def verdict(self, host: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.reports / f"{host}.verdict.json").read_text())
        return data

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        return [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]

    def started(self, test: str) -> float:
        """When the test whose node id ends with `test` started (before its setup)."""
        return next(e["t"] for e in self.events() if e["event"] == "start" and e["nodeid"].endswith(test))

    def reported(self, test: str, outcome: str = "failed") -> float:
        """When the first report of `test` with `outcome` existed (evidence and diagnosis attached)."""
        return next(e["t"] for e in self.events()
                    if e["event"] == "report" and e["nodeid"].endswith(test) and e["outcome"] == outcome)

    def outcomes(self) -> dict[str, int]:
        """pytest's final counts line, e.g. {"passed": 2, "failed": 1, "skipped": 4}."""
        lines = [line for line in self.out.splitlines() if re.match(r"^=+ .*\d+ \w+.* in [\d.]+s", line)]
        assert lines, f"no pytest summary line in the output:\n{self.out[-3000:]}"
        return {name: int(n) for n, name in re.findall(r"(\d+) (\w+)", lines[-1]) if name != "in"}

    def section(self, title_start: str, test: str | None = None) -> str:
        """The body of the first report section whose title starts with `title_start` (in the block of
        the failure of `test` when given)."""
        text = self.out
        if test is not None:
            start = text.find(f" {test} ")
            assert start != -1, f"no failure block for {test} in the output"
            text = text[start:]
        match = re.search(rf"^-+ {re.escape(title_start)}.*?-+\n(.*?)(?=^[-_=]{{5,}} )", text, re.M | re.S)
        assert match, f"no section {title_start!r} in the output"
        return match.group(1)

    def assert_clean(self) -> None:
        """No INTERNALERROR, no traceback of the plugin itself, and a normal pytest exit."""
        assert "INTERNALERROR" not in self.out, self.out[-4000:]
        assert self.rc in (0, 1), f"pytest exited {self.rc}:\n{self.out[-4000:]}"


class SuiteRun:
    """``python -m pytest suites/<suite> --host <profile> ...`` in a session of its own."""

    def __init__(self, workdir: Path, profile: Path, *args: str, suites: Sequence[str] = ("smoke",),
                 env: Mapping[str, str] | None = None, name: str = "run") -> None:
        self.workdir = workdir
        self.reports = workdir / f"{name}-reports"
        self.events_path = workdir / f"{name}-events.jsonl"
        self.out_path = workdir / f"{name}.out"
        self.argv = [sys.executable, "-m", "pytest", *(str(SUITES / s) for s in suites), "-p", "no:cacheprovider",
                     "-p", RECORDER, "--host", str(profile), f"--dflash-report={self.reports}",
                     "--request-timeout=20s", *args]
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_COMMAND_LOG", "PYTEST_XDIST"))}
        self.env = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
                    "DFLASH_SCENARIO_EVENTS": str(self.events_path), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> SuiteRun:
        self.out_file = open(self.out_path, "wb")  # noqa: SIM115 - closed in wait()/cleanup()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self.out_file, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def wait(self, timeout: float) -> Outcome:
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cleanup()
            raise AssertionError(f"the run did not end within {timeout:g}s (a hang):\n{self.output()[-4000:]}") from None
        seconds = time.monotonic() - self.started
        self.out_file.close()
        return Outcome(rc, self.output(), seconds, self.reports, self.events_path)

    def kill(self) -> None:
        """SIGKILL the pytest process alone, as a crashed CI job or the OOM killer would."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def cleanup(self) -> None:
        """Whatever this run started and left: its process group, and its ssh control master (which
        daemonizes into a session of its own; its socket is named after the run's pid)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        for socket_path in Path("/tmp").glob(f"pytest-dflash-ssh-{self.proc.pid}-*"):
            subprocess.run(["ssh", "-S", str(socket_path), "-O", "exit", "dflash-scenario"], capture_output=True,
                           timeout=15, check=False)
        with contextlib.suppress(OSError):
            self.out_file.close()


@contextlib.contextmanager
def suite_runs(workdir: Path) -> Iterator[Callable[..., SuiteRun]]:
    """make(profile, *args, name=..., env=..., suites=...) -> a started SuiteRun; all cleaned up afterwards."""
    runs: list[SuiteRun] = []

    def make(profile: Path, *args: str, **kwargs: Any) -> SuiteRun:
        run = SuiteRun(workdir, profile, *args, **kwargs)
        runs.append(run)
        return run.start()

    try:
        yield make
    finally:
        for run in runs:
            run.cleanup()

