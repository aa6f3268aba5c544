"""Services that are docker / podman containers on a host, driven through the host's transport.

Attach mode finds a running container by name (`container = "sglang"`) or by one label
(`label = "app=sglang"`) and only reads it: `inspect`, `logs`, `exec` of read-only probes, `ps`.
`--provision` runs one from the profile (`run -d`), labelled `pytest-dflash.run=<run id>` and
`pytest-dflash.host=<profile>`; teardown stops and removes it. A container left by a killed run still
carries those labels: `reap_stale_containers` (container_engine.py) removes it on the next run of that
profile, and never a container without the label (this tool did not create it).

The kind is three modules: this one the manager, container_engine.py what the engine says (labels, `inspect`
read as a state, the reaper), container_table.py the profile table (`CONTAINER_KEYS`).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_dflash.config.placeholders import render
from pytest_dflash.config.profiles import ContainerSpec, ServiceSpec
from pytest_dflash.errors import Death, ServiceError, TransportError
from pytest_dflash.hostaccess.transport import JOURNAL_SLACK_S, CommandResult, Transport, parse_probe_output
from pytest_dflash.services.base import Kind, LaunchEnvironment, LogMark, ServiceHost, ServiceState
from pytest_dflash.services.container_engine import (
    DESCRIBE_FORMAT,
    HOST_LABEL,
    INSPECT_FORMAT,
    OWNER_LABEL,
    RUN_LABEL,
    SERVICE_LABEL,
    engine_prefix,
    not_found,
    reap_stale_containers,
    state_from_inspect,
)
from pytest_dflash.services.container_table import CONTAINER_KEYS, TABLE

__all__ = ["CONTAINER_KEYS", "KIND", "TABLE", "ContainerService", "reap_stale_containers",
           "state_from_inspect"]


@dataclass
class ContainerService:
    """A docker / podman container on a host."""

    spec: ServiceSpec
    transport: Transport
    host: str
    run_id: str
    _provisioned: bool = False
    _attached: str | None = None  # the container name found by attach
    _log_error: str = ""
    _oom_checked: dict[str, str] = field(default_factory=dict)

    @property
    def box(self) -> ContainerSpec:
        assert self.spec.container is not None
        return self.spec.container

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def container(self) -> str:
        """The container's name on the host."""
        if self._attached:
            return self._attached
        if self.box.name:
            return self.box.name
        if self.box.label and not self._provisioned:
            return self._find_by_label()
        return f"pytest-dflash-{self.host}-{self.name}-{self.run_id}".replace(":", "-").replace("/", "-")

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
        return None  # the container's environment is its image's and the engine's, not this run's

    def attach(self) -> str:
        """Attach mode: the container must be running already (its state is read first); nothing changes."""
        return "container"

    @property
    def engine(self) -> str:
        return engine_prefix(self.box)

    def _find_by_label(self) -> str:
        out = self.transport.check(f"{self.engine} ps -a --filter %s --format '{{{{.Names}}}}'",
                                   f"label={self.box.label}", timeout_s=20, root=True)
        names = sorted(set(out.split()))
        if len(names) != 1:
            found = f"{len(names)} ({', '.join(names[:5])})" if names else "none"
            raise ServiceError(f"{self.host}/{self.name}: expected one container labelled {self.box.label}, "
                               f"found {found}")
        self._attached = names[0]
        return names[0]

    # ---- provisioning ------------------------------------------------------------------------------

    def values(self) -> dict[str, str]:
        return {"port": str(self.spec.port or ""), "service": self.name, "host": self.host,
                "run_id": self.run_id, "gpus": ",".join(str(g) for g in self.spec.gpus), **self.spec.vars}

    def _shared_run_options(self) -> list[str]:
        """What every container this tool runs for the service gets: the run labels, runtime, ulimits, GPUs
        and devices, the env names (values from the command's environment: never on a command line), the
        mounts."""
        box = self.box
        argv = ["--label", f"{RUN_LABEL}={self.run_id}", "--label", f"{HOST_LABEL}={self.host}", "--label",
                f"{SERVICE_LABEL}={self.name}", "--label",
                f"{OWNER_LABEL}={socket.gethostname()}:{os.getpid()}"]
        if box.runtime and box.engine == "docker":
            argv += ["--runtime", box.runtime]
        for item in box.ulimits:
            argv += ["--ulimit", item]
        if box.gpus:
            argv += ["--gpus", box.gpus if box.gpus == "all" else f'"{box.gpus}"']
        for device in box.devices:
            argv += ["--device", device]
        for key in self.spec.env:
            argv += ["--env", key]
        for mount in box.mounts:
            argv += ["-v", os.path.expanduser(mount) if mount.startswith("~") else mount]
        return argv

    def run_argv(self, name: str) -> list[str]:
        """The `run` arguments after the engine: options, image, command."""
        box = self.box
        if not box.image:
            raise ServiceError(f"{self.host}/{self.name}: --provision needs services.{self.name}.image")
        argv = ["run", "-d", "--name", name, *self._shared_run_options()]
        if box.network:
            argv += ["--network", box.network]
        if self.spec.port and box.network != "host":
            argv += ["-p", f"{self.spec.port}:{self.spec.port}"]
        for flag, value in (("--ipc", box.ipc), ("--shm-size", box.shm_size), ("--restart", box.restart),
                            ("--memory", box.memory)):
            if value:
                argv += [flag, value]
        if box.memory:
            argv += ["--memory-swap", box.memory]  # the limit is the limit: no swap to hide an OOM in
        argv += list(box.run_args)
        try:
            command = [render(part, self.values(), where=f"services.{self.name}.command")
                       for part in (*self.spec.command, *box.args)]
        except ValueError as exc:
            raise ServiceError(str(exc)) from None
        return [*argv, box.image, *command]

    def start(self) -> None:
        name = self.container
        existing = self._inspect_line(name)
        if existing is not None:
            owner = existing.split("\t")[3] if existing.count("\t") >= 3 else ""
            if not owner or owner == "<no value>":
                raise ServiceError(
                    f"{self.host}: container {name} exists and was not created by pytest-dflash; refusing to "
                    "replace it (attach to it instead, or give the profile another container name)")
            raise ServiceError(f"{self.host}: container {name} of run {owner} still exists (a live run of "
                               "this profile on another controller?); not touching it")
        argv = self.run_argv(name)
        # recorded before it is started: cleanup removes it even if `run` half failed
        self._provisioned = True
        result = self.transport.run(f"{self.engine} {' '.join(shlex.quote(a) for a in argv)}", mutating=True,
                                    timeout_s=max(120.0, self.transport.timeout_s), env=dict(self.spec.env))
        if not result.ok:
            raise ServiceError(f"{self.host}/{self.name}: `{self.box.engine} run` exited {result.rc}: "
                               f"{' '.join(result.tail(3).split())}")

    def stop(self) -> None:
        if not self._provisioned:
            return
        name = self.container
        timeout = f"{self.box.stop_timeout_s:g}"
        errors = []
        for command in (f"{self.engine} stop -t {timeout} {shlex.quote(name)}",
                        f"{self.engine} rm -f {shlex.quote(name)}"):
            try:
                result = self.transport.run(command, mutating=True, timeout_s=self.box.stop_timeout_s + 60)
            except TransportError as exc:
                errors.append(str(exc))
                continue
            if not result.ok and not not_found(result):
                errors.append(f"`{command}` exited {result.rc}: {' '.join(result.tail(2).split())}")
        self._provisioned = False
        gone = self._inspect_line(name) is None
        if errors and not gone:
            raise ServiceError(f"{self.host}/{self.name}: teardown incomplete: {'; '.join(errors)}")

    # ---- reading -----------------------------------------------------------------------------------

    def _inspect_line(self, name: str) -> str | None:
        result = self.transport.run(f"{self.engine} container inspect --format %s %s", INSPECT_FORMAT, name,
                                    timeout_s=15, root=True)
        if result.ok and result.stdout.strip():
            return result.stdout.strip().splitlines()[0]
        if not_found(result):
            return None
        raise TransportError(f"{self.host}: `{self.box.engine} inspect {name}` exited {result.rc}: "
                             f"{' '.join(result.tail(2).split())}")

    def state(self) -> ServiceState:
        try:
            name = self.container
        except ServiceError as exc:
            return ServiceState(running=False, death=Death(detail=str(exc).split(": ", 1)[-1]))
        line = self._inspect_line(name)
        if line is None:
            return ServiceState(running=False, death=Death(detail=f"container {name} not found on the host"))
        state = state_from_inspect(line, restart_policy=self.box.restart)
        death = state.death
        if death is not None and death.exit_status == 137 and death.result != "oom-kill":
            # Some engines miss their own OOM kills (podman 4.3 + runc on hybrid cgroups: OOMKilled=false):
            # the kernel log names the container's memory cgroup, which holds its id.
            container_id = line.split("\t")[2] if line.count("\t") >= 2 else ""
            kernel = self._kernel_oom_line(container_id)
            if kernel:
                death.result = "oom-kill"
                death.detail += (f"; the kernel OOM-killed it (memory cgroup of this container; inspect "
                                 f"said OOMKilled=false): {kernel}")
        return state

    def _kernel_oom_line(self, container_id: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{12,64}", container_id):
            return ""
        if container_id in self._oom_checked:
            return self._oom_checked[container_id]
        command = (f"{{ journalctl -k --no-pager 2>/dev/null; dmesg 2>/dev/null; }} | grep -F {container_id} "
                   "| grep -E 'oom-kill|Killed process|out of memory' | tail -n 1")
        try:
            line = self.transport.run(command, timeout_s=15).stdout.strip()
        except TransportError:
            line = ""
        found = line[-300:]
        self._oom_checked[container_id] = found
        return found

    def log_mark(self) -> LogMark:
        return LogMark(time.time() + self.transport.clock_offset())

    def logs_since(self, mark: LogMark | None, lines: int) -> str:
        try:
            name = self.container
        except ServiceError as exc:
            return f"(no logs: {exc})"
        since = ""
        if mark is not None:
            since = f" --since {mark.wall_time - self.transport.clock_error_s - JOURNAL_SLACK_S:.3f}"
        # At most LOG_READ_BYTES of it (read_tail: cut on the host, decoded with replacement): --tail counts
        # lines, and a line can be megabytes.
        result = self.transport.read_tail(
            f"{self.engine} logs{since} --tail {int(lines)} --timestamps {shlex.quote(name)} 2>&1",
            timeout_s=20, root=True)
        return result.stdout

    def describe(self) -> dict[str, str]:
        try:
            name = self.container
            result = self.transport.run(f"{self.engine} container inspect --format %s %s", DESCRIBE_FORMAT,
                                        name, timeout_s=15, root=True)
        except (ServiceError, TransportError) as exc:
            return {"container": self.box.name or self.box.label or "?", "error": str(exc)}
        info = {"engine": self.box.engine, "container": name}
        if result.ok:
            image, policy, memory, cmd = [*result.stdout.strip().split("\t"), "", "", "", ""][:4]
            info.update(image=image, restart_policy=policy, memory_limit=memory, command=cmd)
        return {k: v for k, v in info.items() if v and v != "0"}

    # ---- probes inside the container ---------------------------------------------------------------

    def exec_python(self, source: str, args: Sequence[str] = (), *, python: str = "python3",
                    timeout_s: float | None = None) -> CommandResult:
        """Run a read-only probe script inside the container, in the service's own environment (`exec -i`)."""
        payload = base64.b64encode(source.encode()).decode()
        argv = " ".join(shlex.quote(a) for a in args)
        return self.transport.run(f"printf %s {payload} | base64 -d | {self.engine} exec -i "
                                  f"{shlex.quote(self.container)} {shlex.quote(python)} - {argv}",
                                  timeout_s=timeout_s, root=True)

    def exec_probe(self, source: str, args: Sequence[str] = (), **kwargs: Any) -> dict[str, Any]:
        return parse_probe_output(self.exec_python(source, args, **kwargs),
                                  host=f"{self.host}/{self.container}")

    @property
    def guest_python(self) -> str:
        """The python the service runs inside its image: its command's interpreter (an absolute path), else
        python3."""
        first = [*self.spec.command, *self.box.args][:1]
        if first and first[0].startswith("/") and "python" in os.path.basename(first[0]):
            return first[0]
        return "python3"

    def launch_environment(self, *, live: bool) -> LaunchEnvironment:
        """The profile's env and no command line: the probes run inside the container (`run_probe`), in its
        image's environment."""
        return LaunchEnvironment((), dict(self.spec.env), None, "profile env (probes run in the container)")

    def run_probe(self, source: str, args: Sequence[str] = (), *,
                  timeout_s: float | None = None) -> dict[str, Any]:
        """Run a read-only probe in the service's own environment (its image's python, the container's env).

        A running container: `exec -i` into it (read-only, allowed in attach mode). Not running yet while
        provisioning (the env / kernels layers start nothing): a throwaway `run --rm -i` of the service's
        image with its env, mounts, GPUs and devices (not its memory limit), labelled like the service (a
        killed run's leftover is reaped).
        Attached and not running: a one-line ServiceError."""
        attached = self.transport.read_only
        name: str | None = None
        line: str | None = None
        # provisioning: only the container this run started, never a namesake
        if attached or self._provisioned:
            try:
                name = self.container
                line = self._inspect_line(name)
            except ServiceError:
                name = None
            if (name and line is not None
                    and state_from_inspect(line, restart_policy=self.box.restart).running):
                return self.exec_probe(source, args, python=self.guest_python, timeout_s=timeout_s)
        if attached or not self.box.image:
            found = f"container {name} is not running" if name and line is not None else \
                f"no container {name or self.box.label or self.name} found"
            raise ServiceError(f"{self.host}/{self.name}: {found}: its probes run inside it "
                               f"(`{self.box.engine} exec`); start it, or run with --provision and "
                               f"services.{self.name}.image")
        payload = base64.b64encode(source.encode()).decode()
        argv = [*self.probe_run_argv(), *args]
        result = self.transport.run(f"printf %s {payload} | base64 -d | {self.engine} "
                                    f"{' '.join(shlex.quote(a) for a in argv)}", mutating=True,
                                    timeout_s=timeout_s, env=dict(self.spec.env),
                                    shown=f"{self.engine} {' '.join(argv[:3])} … (probe "
                                    f"in a throwaway container of {self.box.image})")
        return parse_probe_output(result, host=f"{self.host}/{self.box.image}")

    def probe_run_argv(self) -> list[str]:
        """`run --rm -i` of the service's image, its python reading a probe on stdin (the args after the
        engine)."""
        box = self.box
        argv = ["run", "--rm", "-i", *self._shared_run_options()]
        for flag, value in (("--ipc", box.ipc), ("--shm-size", box.shm_size)):
            if value:
                argv += [flag, value]
        # no --memory: the limit sizes the server, and a probe importing torch under a server-sized 64m would
        # die
        return [*argv, "--entrypoint", self.guest_python, str(box.image), "-"]


def _make(spec: ServiceSpec, host: ServiceHost) -> ContainerService:
    return ContainerService(spec, host.transport, host=host.name, run_id=host.run_id)


def _reap(host: ServiceHost, specs: list[ServiceSpec]) -> list[str]:
    """Once per engine (and runtime) the profile's containers use."""
    engines = {(s.container.engine,
                s.container.runtime): s.container for s in specs if s.container is not None}
    notes: list[str] = []
    for container in engines.values():
        notes += reap_stale_containers(host.transport, container, host=host.name, run_id=host.run_id)
    return notes


KIND = Kind("container", make=_make, reap=_reap, table=TABLE)
