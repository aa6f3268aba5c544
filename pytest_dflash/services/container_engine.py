"""What a container engine says, and what a dead run left: docker / podman labels and formats, one `inspect`
line read as a ServiceState, and the reaper of containers a killed run left behind (by their labels).

State is one `inspect` call: Status, ExitCode, OOMKilled, RestartCount, health, StartedAt. An exited
or restarting container is dead (with how it ended); a RestartCount that grows is a restart loop.
"""

from __future__ import annotations

import shlex
import socket
from typing import Any

from pytest_dflash.config.profiles import ContainerSpec
from pytest_dflash.documents import loads_json
from pytest_dflash.errors import Death
from pytest_dflash.hostaccess.transport import CommandResult, Transport
from pytest_dflash.services.base import ServiceState
from pytest_dflash.services.process import pid_alive

RUN_LABEL = "pytest-dflash.run"
HOST_LABEL = "pytest-dflash.host"
OWNER_LABEL = "pytest-dflash.owner"
SERVICE_LABEL = "pytest-dflash.service"
# One line of `inspect` output: what the state needs, and nothing else (Config.Env may hold secrets).
INSPECT_FORMAT = ("{{json .State}}\t{{.RestartCount}}\t{{.Id}}\t"
                  '{{index .Config.Labels "' + RUN_LABEL + '"}}\t{{.Name}}')
DESCRIBE_FORMAT = ("{{.Config.Image}}\t{{json .HostConfig.RestartPolicy}}\t{{.HostConfig.Memory}}\t"
                   "{{json .Config.Cmd}}")
SIGNAL_NAMES = {1: "HUP", 2: "INT", 3: "QUIT", 6: "ABRT", 9: "KILL", 11: "SEGV", 15: "TERM"}
NOT_FOUND = ("no such container", "no such object", "not found")
CONTAINER_ENGINES = ("docker", "podman")

def engine_prefix(container: ContainerSpec) -> str:
    """`podman --runtime runc` / `docker`: the engine and its global options."""
    podman_runtime = container.runtime and container.engine == "podman"
    runtime = f" --runtime {shlex.quote(container.runtime or '')}" if podman_runtime else ""
    return f"{container.engine}{runtime}"


def state_from_inspect(line: str, *, restart_policy: str | None = None) -> ServiceState:
    """One `inspect --format INSPECT_FORMAT` line to a ServiceState (death when exited, restarting or
    dead)."""
    raw_state, _, rest = line.strip().partition("\t")
    restarts_raw, _, rest = rest.partition("\t")
    try:
        state: dict[str, Any] = loads_json(raw_state)
    except ValueError:  # JSONDecodeError, DocumentTooDeep
        return ServiceState(running=False, death=Death(detail=f"unreadable inspect output: {line[:200]!r}"))
    restarts = int(restarts_raw) if restarts_raw.strip().isdigit() else 0
    status = str(state.get("Status") or "").lower()
    health = state.get("Health") or state.get("Healthcheck") or {}
    health_status = str(health.get("Status") or "") if isinstance(health, dict) else ""
    code = int(state.get("ExitCode") or 0)
    oom = bool(state.get("OOMKilled"))
    props = {"ActiveState": status, "SubState": health_status or "no-healthcheck", "ExitCode": str(code),
             "OOMKilled": str(oom).lower(), "RestartCount": str(restarts),
             "StartedAt": str(state.get("StartedAt", "")), "FinishedAt": str(state.get("FinishedAt", "")),
             "Error": str(state.get("Error") or "")}
    pid = int(state.get("Pid") or 0) or None
    restarting = bool(state.get("Restarting")) or status == "restarting"
    if status == "running" and not restarting:
        return ServiceState(running=True, restarts=restarts, pid=pid, properties=props)
    if status in ("created", "configured", "initialized") and not code:
        return ServiceState(running=True, restarts=restarts, properties=props)  # starting
    policy = f", restart policy {restart_policy}" if restart_policy and restart_policy != "no" else ""
    loop = f", restart loop (RestartCount={restarts}{policy})" if restarts or restarting else ""
    if not loop and policy:
        loop = f", RestartCount=0{policy}: the engine will start it again"
    ended = props["FinishedAt"]
    finished = f" at {ended}" if ended and not ended.startswith("0001") else ""
    if oom:
        death = Death(exit_status=code or 137, signal="KILL", result="oom-kill",
                      detail=f"OOMKilled=true: the container hit its memory limit{finished}{loop}")
    elif code > 128 and code - 128 in SIGNAL_NAMES:
        death = Death(exit_status=code, signal=SIGNAL_NAMES[code - 128],
                      detail=f"container {status or 'gone'} (ExitCode={code}){finished}{loop}")
    else:
        error = f", error: {props['Error']}" if props["Error"] else ""
        death = Death(exit_status=code,
                      detail=f"container {status or 'gone'} (ExitCode={code}){finished}{loop}{error}")
    return ServiceState(running=False, death=death, restarts=restarts, properties=props)


def not_found(result: CommandResult) -> bool:
    text = f"{result.stdout}\n{result.stderr}".lower()
    return not result.ok and any(marker in text for marker in NOT_FOUND)


def reap_stale_containers(transport: Transport, container: ContainerSpec, *, host: str,
                          run_id: str) -> list[str]:
    """Remove containers a dead run of this host profile left (by their labels). Call only holding the host
    lock.

    Only containers carrying `pytest-dflash.host=<host>` and a run label other than `run_id`; on a local host,
    only when their controller process is gone (a live run of another profile is never touched)."""
    engine = engine_prefix(container)
    out = transport.run(f"{engine} ps -a --filter %s --filter %s --format '{{{{.Names}}}}'",
                        f"label={HOST_LABEL}={host}", f"label={RUN_LABEL}", timeout_s=20, root=True)
    done: list[str] = []
    if not out.ok:
        return [f"could not list stale containers: {' '.join(out.tail(2).split())}"]
    for name in sorted(set(out.stdout.split())):
        labels = transport.run(f"{engine} container inspect --format %s %s",
                               '{{index .Config.Labels "' + RUN_LABEL + '"}}\t{{index .Config.Labels "'
                               + OWNER_LABEL + '"}}', name, timeout_s=15, root=True)
        if not labels.ok:
            continue
        owner_run, _, owner = labels.stdout.strip().partition("\t")
        if not owner_run or owner_run == "<no value>" or owner_run == run_id:
            continue
        owner_host, _, owner_pid = owner.partition(":")
        mine_alive = owner_host == socket.gethostname() and owner_pid.isdigit() and pid_alive(int(owner_pid))
        if transport.is_local and mine_alive:
            continue
        transport.run(f"{engine} rm -f {shlex.quote(name)}", mutating=True,
                      timeout_s=container.stop_timeout_s + 60)
        done.append(f"removed stale container {name} left by run {owner_run}")
    return done
