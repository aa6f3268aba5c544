"""The profile table of a container service: its keys (`CONTAINER_KEYS`, with their JSON Schema) read into
a `ContainerSpec` (docs/profiles.md). They are unknown keys on a service of another kind."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_dflash.config.profiles import ContainerSpec, HostProfile, ServiceSpec
from pytest_dflash.config.tables.kinds import KindTable
from pytest_dflash.config.tables.reader import Table
from pytest_dflash.services.container_engine import CONTAINER_ENGINES

# The container keys of a [services.NAME] table with kind = "container" (docs/profiles.md), and their JSON
# Schema (config/schema.py's $defs: strings, duration).
CONTAINER_KEYS: dict[str, Any] = {
    "engine": {"enum": list(CONTAINER_ENGINES), "default": "docker"},
    "runtime": {"type": "string"},
    "container": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"},
    "label": {"type": "string", "pattern": r"^[A-Za-z0-9_.\-/]+=\S*$"},
    "image": {"type": "string"},
    "args": {"$ref": "#/$defs/strings"},
    "devices": {"$ref": "#/$defs/strings"},
    "mounts": {"type": "array", "items": {"type": "string", "pattern": ":"}},
    "network": {"type": "string"},
    "ipc": {"type": "string"},
    "shm_size": {"type": "string"},
    "restart": {"type": "string", "pattern": r"^(no|always|unless-stopped|on-failure(:\d+)?)$"},
    "memory": {"type": "string"},
    "ulimits": {"type": "array", "items": {"type": "string", "pattern": r"^[a-z]+=-?\d+(:-?\d+)?$"}},
    "run_args": {"$ref": "#/$defs/strings"},
    "stop_timeout": {"$ref": "#/$defs/duration"},
}



def read_container_table(table: Table, spec: ServiceSpec, host: HostProfile,
                         profile_dir: Path) -> ServiceSpec:
    """The container keys, as the service's `ContainerSpec`; `gpus` (indices, or "all") is its `--gpus`."""
    engine = table.choice("engine", CONTAINER_ENGINES, "docker")
    name = table.get("container", str)
    label = table.get("label", str)
    if label is not None and not re.fullmatch(r"[A-Za-z0-9_.\-/]+=\S*", label):
        raise table.fail("label", f'expected "key=value", got {label!r}')
    if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise table.fail("container", f"expected a container name ([A-Za-z0-9][A-Za-z0-9_.-]*), got {name!r}")
    restart = table.get("restart", str)
    if restart is not None and not re.fullmatch(r"no|always|unless-stopped|on-failure(:\d+)?", restart):
        raise table.fail("restart", f"expected no, on-failure[:N], always or unless-stopped, got {restart!r}")
    ulimits = table.str_list("ulimits")
    for item in ulimits:
        if not re.fullmatch(r"[a-z]+=-?\d+(:-?\d+)?", item):
            raise table.fail("ulimits", f'expected items like "nofile=1024:1024", got {item!r}')
    mounts = table.str_list("mounts")
    for item in mounts:
        if ":" not in item:
            raise table.fail("mounts", f'expected items like "/host/dir:/container/dir[:ro]", got {item!r}')
    gpus = "all" if table.raw("gpus") == "all" else None
    if spec.gpus:
        gpus = "device=" + ",".join(str(g) for g in spec.gpus)
    container = ContainerSpec(
        engine=engine or "docker",
        runtime=table.get("runtime", str),
        name=name,
        label=label,
        image=table.get("image", str),
        args=table.str_list("args"),
        gpus=gpus,
        devices=table.str_list("devices"),
        mounts=mounts,
        network=table.get("network", str),
        ipc=table.get("ipc", str),
        shm_size=table.get("shm_size", str),
        restart=restart,
        memory=table.get("memory", str),
        ulimits=ulimits,
        run_args=table.str_list("run_args"),
        stop_timeout_s=table.duration("stop_timeout", 30.0),
    )
    return replace(spec, container=container)


TABLE = KindTable("container", read=read_container_table, keys=CONTAINER_KEYS, all_gpus=True,
                  schema={"properties": {"gpus": {"anyOf": [{"$ref": "#/$defs/gpus"}, {"const": "all"}]}}})
