"""What each service of a host runs, and in which environment: the probes run in exactly that.

  * process services: the profile's `command` and `env`;
  * systemd services: the live unit's ExecStart / Environment= / User= (`systemctl show`, read-only)
    in attach mode, the rendered template when provisioning (or when the unit is not installed).
    systemd gives a unit a minimal PATH unless its Environment= sets one, and FlashInfer finds nvcc
    and ninja through PATH, so the probes get that PATH too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_dflash.errors import DflashError
from pytest_dflash.layers.gpu.chains import parse_environment, parse_exec_start, parse_unit

if TYPE_CHECKING:
    from pytest_dflash.config.profiles import ServiceSpec
    from pytest_dflash.run.state import HostContext

SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
# Variables that do not change what a probe finds; services differing only in these share probes.
IRRELEVANT = frozenset({"CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"})


@dataclass(frozen=True)
class ServiceView:
    name: str
    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    user: str | None
    source: str  # where argv/env were read from
    gpus: tuple[int, ...] = ()


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


def _render(text: str, python: str) -> str:
    return text.replace("{python}", python)


def _from_unit_text(spec: ServiceSpec, text: str, source: str) -> ServiceView:
    keys = parse_unit(text)
    env = parse_environment(keys.get("Environment", []))
    env.setdefault("PATH", SYSTEMD_DEFAULT_PATH)
    argv = parse_exec_start(keys["ExecStart"][-1]) if keys.get("ExecStart") else []
    user = keys["User"][-1] if keys.get("User") else None
    return ServiceView(spec.name, spec.kind, tuple(argv), env, user, source, spec.gpus)


def service_view(host: HostContext, spec: ServiceSpec) -> ServiceView | None:
    """How `spec` runs on `host`; None for services without host access (attached by URL)."""
    python = host.profile.python
    if spec.kind == "external" or not host.has_host_access:
        return None
    if spec.kind == "process":
        argv = tuple(_render(part, python) for part in spec.command)
        return ServiceView(spec.name, spec.kind, argv, dict(spec.env), None, "profile command", spec.gpus)
    if not host.provisioning and spec.unit:
        from pytest_dflash.services.systemd import parse_show

        result = host.transport.run("systemctl show -p LoadState,ExecStart,Environment,User %s", spec.unit,
                                    timeout_s=15)
        props = parse_show(result.stdout) if result.ok else {}
        if props.get("LoadState") == "loaded":
            env = parse_environment([props.get("Environment", "")])
            env.setdefault("PATH", SYSTEMD_DEFAULT_PATH)
            exec_start = parse_exec_start(props.get("ExecStart", ""))
            return ServiceView(spec.name, spec.kind, tuple(exec_start), env, props.get("User") or None,
                               f"live unit {spec.unit}", spec.gpus)
    if spec.template is not None:
        from pytest_dflash.services.systemd import SystemdService

        manager = SystemdService(spec, host.transport, host=host.name, run_id=host.run.run_id, python=python)
        try:
            return _from_unit_text(spec, manager.render_unit(), f"template {spec.template.name}")
        except DflashError:
            pass
    env = dict(spec.env)
    env.setdefault("PATH", SYSTEMD_DEFAULT_PATH)
    return ServiceView(spec.name, spec.kind, (), env, None,
                       "profile env only (unit not installed, no template)", spec.gpus)


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
