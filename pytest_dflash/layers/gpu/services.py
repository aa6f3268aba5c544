"""What each service of a host runs, and in which environment: the probes run in exactly that.

Each service's manager says how its server is launched (`services.base.LaunchesOnHost`): a process service its
profile command and env; a systemd service its live unit (attach mode) or rendered template, with systemd's
default PATH; a container service its profile env (its probes run inside the container, `RunsProbes`). A
service without one (attached by URL), or on a host without host access, has no view.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_dflash.services.base import LaunchesOnHost, RunsProbes

if TYPE_CHECKING:
    from pytest_dflash.config.profiles import ServiceSpec
    from pytest_dflash.run.state import HostContext

# Variables that do not change what a probe finds; services differing only in these share probes.
IRRELEVANT = frozenset({"CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"})


@dataclass(frozen=True)
class ServiceView:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    user: str | None
    source: str  # where argv/env were read from
    gpus: tuple[int, ...] = ()
    # its probes run in the service's own environment (a container's), not on the host: a group of its own
    own_environment: bool = False


@dataclass(frozen=True)
class ProbeGroup:
    """Services whose environment is the same for the probes: probed once, in `env`."""

    key: str
    env: Mapping[str, str]
    services: tuple[str, ...]
    user: str | None = None
    commands: tuple[tuple[str, ...], ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        return ",".join(self.services)


def service_view(host: HostContext, spec: ServiceSpec) -> ServiceView | None:
    """How `spec` runs on `host`, as its manager says; None for a service without host access or without a
    launch environment (attached by URL)."""
    if not host.has_host_access:
        return None
    manager = host.service(spec.name).manager
    if not isinstance(manager, LaunchesOnHost):
        return None
    launch = manager.launch_environment(live=not host.provisioning)
    return ServiceView(spec.name, launch.argv, launch.env, launch.user, launch.source, spec.gpus,
                       own_environment=isinstance(manager, RunsProbes))


def probe_groups(views: Sequence[ServiceView]) -> list[ProbeGroup]:
    """Group services whose probe-relevant environment is identical."""
    groups: dict[str, list[ServiceView]] = {}
    for view in views:
        relevant = {k: v for k, v in sorted(view.env.items()) if k not in IRRELEVANT}
        digest = hashlib.sha1(json.dumps([relevant, view.user]).encode(),
                              usedforsecurity=False).hexdigest()[:8]
        groups.setdefault(digest, []).append(view)
    out = []
    for digest, members in groups.items():
        first = members[0]
        out.append(ProbeGroup(digest, dict(first.env), tuple(v.name for v in members), first.user,
                              tuple(v.argv for v in members)))
    return out
