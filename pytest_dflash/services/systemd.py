"""Services that are systemd units on a host, reached through the transport (ssh or local).

Provisioning renders a unit template, marks it with `X-PytestDflash-Run=<run id>` (systemd ignores
X- keys), installs it under /etc/systemd/system, reloads and starts it. Teardown stops, removes and
reloads. A unit left behind by a killed run still carries its marker; `reap_stale_units` finds it.

State is read with one `systemctl show` call. Death is judged from ActiveState/Result/ExecMain*,
never from `is-active` (which says "active" for a process about to crash).

A systemd service's profile table names its unit (`unit = "x.service"`, `TABLE`); the default kind on an ssh://
host. The GPU layers see its launch environment through `launch_environment`: the live unit's ExecStart /
Environment= / User= (`systemctl show`, read-only) in attach mode, else the rendered template. systemd gives a
unit a minimal PATH unless its Environment= sets one, and FlashInfer finds nvcc and ninja through PATH, so the
environment carries that PATH too.
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_dflash.config.parallel import gpu_environment, visible_devices, visible_disagree
from pytest_dflash.config.placeholders import render
from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.config.tables.kinds import KindTable
from pytest_dflash.config.tables.reader import Table
from pytest_dflash.errors import Death, DflashError, ServiceError, TransportError
from pytest_dflash.hostaccess.transport import Transport, journal_since
from pytest_dflash.services.base import Kind, LaunchEnvironment, LogMark, ServiceHost, ServiceState
from pytest_dflash.services.derive import PlainTarget, PlainUnavailable, strip_speculative_text, with_port

UNIT_DIR = "/etc/systemd/system"
MARKER_KEY = "X-PytestDflash-Run"
SHOW_PROPERTIES = (
    "LoadState", "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "ExecMainPID",
    "MainPID", "NRestarts", "ActiveEnterTimestamp", "InactiveEnterTimestamp", "FragmentPath",
)
DESCRIBE_PROPERTIES = (*SHOW_PROPERTIES, "Restart", "ExecStart", "Environment", "WorkingDirectory", "User",
                       "MemoryCurrent", "TasksCurrent")
# ExecMainCode is a CLD_* value from waitid(2).
CLD_KILLED, CLD_DUMPED = 2, 3
SIGNAL_NAMES = {1: "HUP", 2: "INT", 3: "QUIT", 6: "ABRT", 9: "KILL", 11: "SEGV", 15: "TERM"}
# The PATH systemd gives a unit whose Environment= sets none.
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


def parse_unit(text: str) -> dict[str, list[str]]:
    """A unit file's [Service] keys -> values (repeated keys kept in order; line continuations joined)."""
    joined = text.replace("\\\n", " ")
    section = ""
    out: dict[str, list[str]] = {}
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section == "Service" and "=" in line:
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def parse_environment(values: Iterable[str]) -> dict[str, str]:
    """systemd Environment= values ('A=1 "B=two words"') -> {'A': '1', 'B': 'two words'}."""
    env: dict[str, str] = {}
    for value in values:
        for item in shlex.split(value):
            if "=" in item:
                key, val = item.split("=", 1)
                env[key] = val
    return env


def parse_exec_start(value: str) -> list[str]:
    """ExecStart as written in a unit ('-/usr/bin/x a b') or as `systemctl show` prints it
    ('{ path=/usr/bin/x ; argv[]=/usr/bin/x a b ; ignore_errors=no ; ... }') -> argv."""
    value = value.strip()
    if value.startswith("{") and "argv[]=" in value:
        inner = value.split("argv[]=", 1)[1]
        return shlex.split(inner.split(" ; ", 1)[0])
    argv = shlex.split(value)
    if argv:
        argv[0] = argv[0].lstrip("-@:+!")
    return argv


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p A,B unit` output (KEY=VALUE lines) to a dict."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def death_from_properties(props: Mapping[str, str]) -> Death:
    code = _int(props.get("ExecMainCode"))
    status = _int(props.get("ExecMainStatus"))
    restarts = _int(props.get("NRestarts")) or 0
    result = props.get("Result") or None
    if code in (CLD_KILLED, CLD_DUMPED) and status:
        name = SIGNAL_NAMES.get(status, str(status))
        return Death(exit_status=128 + status, signal=name, result=result, restarts=restarts,
                     detail=f"status={status}/{name}")
    return Death(exit_status=status, result=result, restarts=restarts,
                 detail=f"status={status}" if status is not None else "")


def state_from_properties(props: Mapping[str, str], *, expect_running: bool) -> ServiceState:
    """Interpret unit properties. `expect_running`: the unit should be up (we started it, or attach found
    it)."""
    active = props.get("ActiveState", "")
    sub = props.get("SubState", "")
    pid = _int(props.get("MainPID")) or None
    restarts = _int(props.get("NRestarts")) or 0
    if props.get("LoadState") == "not-found":
        return ServiceState(running=False, death=Death(detail="unit not found on the host"),
                            properties=dict(props))
    if active == "failed" or (expect_running and active == "inactive"):
        return ServiceState(running=False, death=death_from_properties(props), restarts=restarts,
                            properties=dict(props))
    exited = (_int(props.get("ExecMainCode")) or 0) != 0
    if sub == "auto-restart" or (expect_running and active == "deactivating" and exited):
        # The main process is dead and systemd is about to start it again (Restart=): ActiveState says
        # "activating" for RestartSec and "active" right after, so this is the only moment the death shows.
        death = death_from_properties(props)
        what = ("systemd will restart it (SubState=auto-restart)" if sub == "auto-restart"
                else f"SubState={sub}")
        death.detail = f"{death.detail}, {what}" if death.detail else what
        return ServiceState(running=False, death=death, restarts=restarts, properties=dict(props))
    running = active in ("active", "activating", "reloading") and sub != "auto-restart"
    return ServiceState(running=running, restarts=restarts, pid=pid, properties=dict(props))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "[not set]") else None
    except ValueError:
        return None


@dataclass
class SystemdService:
    """A systemd unit on a host."""

    spec: ServiceSpec
    transport: Transport
    host: str
    run_id: str
    python: str
    _provisioned: bool = False
    _expect_running: bool = False
    _unit_text: str = ""
    _extra_values: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def unit(self) -> str:
        assert self.spec.unit
        return self.spec.unit

    @property
    def provisioned(self) -> bool:
        return self._provisioned

    @property
    def url(self) -> str:
        return self.spec.url_on(self.spec.port)

    @property
    def provisionable(self) -> bool:
        return True

    @property
    def native_api(self) -> bool | None:
        return True  # SGLang (or the refserver) by construction

    @property
    def started_env(self) -> Mapping[str, str] | None:
        return None  # systemd gives a unit its own environment, not this run's

    def values(self) -> dict[str, str]:
        gpus = ",".join(str(g) for g in self.spec.gpus)
        return {"python": self.python, "port": str(self.spec.port or ""), "service": self.name,
                "unit": self.unit, "host": self.host, "run_id": self.run_id,
                "gpu": gpus.split(",")[0] if gpus else "", "gpus": gpus, **self.spec.vars,
                **self._extra_values}

    def render_unit(self) -> str:
        if self.spec.template is None:
            raise ServiceError(f"{self.host}/{self.name}: --provision needs services.{self.name}.template")
        try:
            text = self.spec.template.read_text(encoding="utf-8")
        except OSError as exc:
            raise ServiceError(f"{self.host}/{self.name}: cannot read template {self.spec.template}: "
                               f"{exc}") from None
        try:
            text = render(text, self.values(), where=str(self.spec.template))
        except ValueError as exc:
            raise ServiceError(str(exc)) from None
        env_lines = "".join(f"Environment={shlex.quote(f'{k}={v}')}\n" for k, v in self.spec.env.items())
        marker = f"{MARKER_KEY}={self.run_id} controller={socket.gethostname()}:{os.getpid()}\n"
        if "[Unit]" not in text or "[Service]" not in text:
            raise ServiceError(f"{self.spec.template}: a unit template needs [Unit] and [Service] sections")
        text = text.replace("[Unit]\n", "[Unit]\n" + marker, 1)
        env_lines += self._gpu_env_line(text)
        if env_lines:
            text = text.replace("[Service]\n", "[Service]\n" + env_lines, 1)
        return text

    def _gpu_env_line(self, text: str) -> str:
        """The profile's `gpus` as the unit's CUDA_VISIBLE_DEVICES: added when the template sets none; a
        template (or the profile env) setting other GPUs is refused, naming both, before anything installs."""
        wanted = gpu_environment(self.spec.gpus)
        if not wanted:
            return ""
        env = {**parse_environment(parse_unit(text).get("Environment", [])), **self.spec.env}
        if "CUDA_VISIBLE_DEVICES" not in env:
            return "".join(f"Environment={k}={v}\n" for k, v in wanted.items())
        why = visible_disagree(self.spec.gpus, visible_devices(env))
        if why:
            raise ServiceError(f"{self.host}/{self.name}: unit template {self.spec.template}: {why} "
                               "(write CUDA_VISIBLE_DEVICES={gpus} in the template)")
        return ""

    def start(self) -> None:
        path = f"{UNIT_DIR}/{self.unit}"
        self._unit_text = self.render_unit()
        existing = self.transport.run("cat %s", path, timeout_s=10)
        if existing.ok and MARKER_KEY not in existing.stdout:
            raise ServiceError(
                f"{self.host}: {path} exists and was not installed by pytest-dflash; refusing to overwrite "
                "it (attach to it instead, or give the profile another unit name)"
            )
        self.transport.write_file(path, self._unit_text)
        self._provisioned = True
        self.transport.check("systemctl daemon-reload", mutating=True, timeout_s=60)
        self.transport.run("systemctl reset-failed %s", self.unit, mutating=True, timeout_s=30)
        self.transport.check("systemctl start --no-block %s", self.unit, mutating=True, timeout_s=60)
        self._expect_running = True

    def attach(self) -> str:
        """Attach mode: expect the unit to be running already; change nothing."""
        self._expect_running = True
        return "unit"

    def stop(self) -> None:
        if not self._provisioned:
            return
        path = f"{UNIT_DIR}/{self.unit}"
        errors = []
        for command in (f"systemctl stop {shlex.quote(self.unit)}", f"rm -f {shlex.quote(path)}",
                        "systemctl daemon-reload", f"systemctl reset-failed {shlex.quote(self.unit)}"):
            try:
                self.transport.run(command, mutating=True, timeout_s=120)
            except TransportError as exc:
                errors.append(str(exc))
        self._provisioned = False
        if errors:
            raise ServiceError(f"{self.host}/{self.name}: teardown incomplete: {'; '.join(errors)}")

    def properties(self, names: tuple[str, ...] = SHOW_PROPERTIES) -> dict[str, str]:
        out = self.transport.check("systemctl show -p %s %s", ",".join(names), self.unit, timeout_s=15)
        return parse_show(out)

    def state(self) -> ServiceState:
        return state_from_properties(self.properties(), expect_running=self._expect_running)

    def log_mark(self) -> LogMark:
        return LogMark(time.time() + self.transport.clock_offset())

    def logs_since(self, mark: LogMark | None, lines: int) -> str:
        since = f" {journal_since(mark.wall_time, self.transport.clock_error_s)}" if mark else ""
        # At most LOG_READ_BYTES of it (read_tail: cut on the host, decoded with replacement): -n counts
        # lines, and a line can be megabytes. --all: a line that is not UTF-8 or holds an escape is shown (as
        # bytes, decoded here), not as journalctl's "[27B blob data]".
        result = self.transport.read_tail(
            f"journalctl -u {shlex.quote(self.unit)}{since} -n {int(lines)} --all --no-pager 2>&1",
            timeout_s=20)
        return result.stdout

    def launch_environment(self, *, live: bool) -> LaunchEnvironment:
        """The installed unit's (`live`, when it is loaded), else the rendered template's, else the profile's
        env with systemd's default PATH and no command line."""
        if live and self.spec.unit:
            result = self.transport.run("systemctl show -p LoadState,ExecStart,Environment,User %s",
                                        self.unit, timeout_s=15)
            props = parse_show(result.stdout) if result.ok else {}
            if props.get("LoadState") == "loaded":
                env = parse_environment([props.get("Environment", "")])
                env.setdefault("PATH", SYSTEMD_DEFAULT_PATH)
                exec_start = parse_exec_start(props.get("ExecStart", ""))
                return LaunchEnvironment(tuple(exec_start), env, props.get("User") or None,
                                         f"live unit {self.unit}")
        if self.spec.template is not None:
            try:
                keys = parse_unit(self.render_unit())
            except DflashError:
                pass
            else:
                env = parse_environment(keys.get("Environment", []))
                env.setdefault("PATH", SYSTEMD_DEFAULT_PATH)
                argv = parse_exec_start(keys["ExecStart"][-1]) if keys.get("ExecStart") else []
                return LaunchEnvironment(tuple(argv), env, keys["User"][-1] if keys.get("User") else None,
                                         f"template {self.spec.template.name}")
        env = dict(self.spec.env)
        env.setdefault("PATH", SYSTEMD_DEFAULT_PATH)
        return LaunchEnvironment((), env, None, "profile env only (unit not installed, no template)")

    def describe(self) -> dict[str, str]:
        try:
            props = self.properties(DESCRIBE_PROPERTIES)
        except TransportError as exc:
            return {"unit": self.unit, "error": str(exc)}
        return {"unit": self.unit, **{k: v for k, v in props.items() if v}}


def reap_stale_units(transport: Transport, run_id: str) -> list[str]:
    """Stop and remove units installed by other (dead) runs. Call only while holding the host lock."""
    out = transport.run(f"grep -l '^{MARKER_KEY}=' {UNIT_DIR}/*.service 2>/dev/null", timeout_s=15)
    done = []
    for path in out.stdout.split():
        unit = path.rsplit("/", 1)[-1]
        marker = transport.run(f"grep -m1 '^{MARKER_KEY}=' {shlex.quote(path)}", timeout_s=10).stdout.strip()
        owner = marker.partition("=")[2]
        if owner.split(" ")[0] == run_id:
            continue
        for command in (f"systemctl stop {shlex.quote(unit)}", f"rm -f {shlex.quote(path)}",
                        f"systemctl reset-failed {shlex.quote(unit)}"):
            transport.run(command, mutating=True, timeout_s=120)
        done.append(f"removed stale unit {unit} left by run {owner or '?'}")
    if done:
        transport.run("systemctl daemon-reload", mutating=True, timeout_s=60)
    return done


def _make(spec: ServiceSpec, host: ServiceHost) -> SystemdService:
    return SystemdService(spec, host.transport, host=host.name, run_id=host.run_id,
                          python=host.profile.python)


def _reap(host: ServiceHost, specs: list[ServiceSpec]) -> list[str]:
    return reap_stale_units(host.transport, host.run_id) if specs else []


def _derive_plain(reference: ServiceSpec, target: PlainTarget) -> ServiceSpec:
    """The reference's unit template without --speculative-*, written to `target.directory`; port + 100 unless
    given."""
    if reference.template is None or reference.unit is None or reference.port is None:
        raise PlainUnavailable(f"services.{reference.name} has no unit template to derive a plain server "
                               "from")
    try:
        text = reference.template.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlainUnavailable(f"cannot read {reference.template}: {exc}") from None
    target.directory.mkdir(parents=True, exist_ok=True)
    template = target.directory / f"{target.host}.{target.name}.{target.run_id}.service"
    template.write_text(strip_speculative_text(text), encoding="utf-8")
    new_port = target.port if target.port is not None else reference.port + 100
    return ServiceSpec(name=target.name, kind="systemd", url=with_port(reference.url, new_port),
                       algorithm="NONE", unit=reference.unit.removesuffix(".service") + "-plain.service",
                       template=template, env=reference.env, vars=reference.vars, gpus=target.gpus,
                       port=new_port, ready_timeout_s=reference.ready_timeout_s,
                       sampled_timeout_s=reference.sampled_timeout_s, api_key_env=reference.api_key_env,
                       model=reference.model)


def _read_table(table: Table, spec: ServiceSpec, host: HostProfile, profile_dir: Path) -> ServiceSpec:
    """A systemd service names its unit; its other keys are every kind's (`template` renders the unit)."""
    if not spec.unit:
        raise table.fail("unit", "missing required key for kind = \"systemd\" (expected a unit name)")
    if not spec.unit.endswith(".service") or "/" in spec.unit:
        raise table.fail("unit", f"expected a unit name like 'sglang-dflash.service', got {spec.unit!r}")
    return spec  # a local systemd is allowed too (the controller runs on the GPU host itself)


def _default_for(host: HostProfile) -> bool:
    """The kind of a service whose table names none, on a host reached over ssh."""
    return bool(host.connection) and not host.is_local


TABLE = KindTable("systemd", read=_read_table, default_for=_default_for, schema={"required": ["unit"]})
KIND = Kind("systemd", make=_make, reap=_reap, derive_plain=_derive_plain, table=TABLE)
