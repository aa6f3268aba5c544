"""One host as the host / env / kernels layers see it: probes run once, results cached and recorded.

`GpuHost` runs the probe scripts in pytest_dflash/hostaccess/probes/ under a deadline, where each service
runs (`probe_runner`): on the host with the profile's python and the service's own environment, or, for a
container service, inside its container (`exec`: the image's python and the container's env). Host-wide
probes (gpu_inventory, kernel_log) always run on the host. It keeps the raw JSON in
`host.facts.gpu_probes` (and, with --dflash-probe-dump, in files). Parsed views (inventory,
toolkit report, ...) are derived from those raw results by the pure functions in smi/checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_dflash.config.options import opt_in_hint
from pytest_dflash.errors import DflashError
from pytest_dflash.layers.gpu.chains import PIN_REQUIRERS, Chain, chains_for
from pytest_dflash.layers.gpu.checks import KERNEL_PATTERN, ToolkitReport, installed_versions, toolkit_report
from pytest_dflash.layers.gpu.report import explain
from pytest_dflash.layers.gpu.services import ProbeGroup, ServiceView, probe_groups, service_view
from pytest_dflash.layers.gpu.smi import Inventory, inventory_from_probe
from pytest_dflash.run.skips import could_not_check
from pytest_dflash.services.base import RunsProbes

if TYPE_CHECKING:
    from pytest_dflash.run.state import HostContext

PROBE_TIMEOUTS_S = {"gpu_inventory": 60.0, "kernel_log": 60.0, "torch_facts": 180.0, "packages": 240.0,
                    "cuda_toolkit": 90.0, "sgl_kernel_builds": 60.0, "jit_cache": 60.0}
# Stdlib-only probes that run on the host itself: `python -S`, so start-up skips the venv's site-packages.
SITELESS_PROBES = frozenset({"gpu_inventory", "kernel_log"})
REQUIRERS = ("sglang", "sglang-kernel", "flashinfer-python", "torch", "xgrammar")
KERNEL_STEPS = ("sampling", "decode", "triton")
ALLOW_GPU_USE_INI = "dflash_allow_gpu_use"


@dataclass(frozen=True)
class GpuOptions:
    """Options of the GPU layers (from the command line / ini, see hooks.py)."""

    dump_dir: Path | None = None
    jit_arch_list: str = "9.0"
    jit_objects: tuple[str, ...] = ()
    jit_jobs: int | None = None
    kernels_timeout_s: float = 1500.0
    chain_timeout_s: float = 300.0
    baseline: Path | None = None
    allow_gpu_use: bool = False  # --allow-gpu-use: the kernels layer may build and launch in attach mode


# (source, argv, timeout_s, env) -> the probe's JSON object
ProbeRunner = Callable[[str, Sequence[str], float, Mapping[str, str] | None], dict[str, Any]]


def probe_runner(host: HostContext, group: ProbeGroup | None, *, site: bool = True) -> ProbeRunner:
    """How a probe of `group` runs: inside the container of a container service (`exec` of a read-only probe,
    its image's python and the container's own env; `env` is not applied), else on the host with the profile's
    python and `env`. Host-wide probes (no group) run on the host."""
    managers = [host.service(name).manager for name in group.services] if group is not None else []
    containers = [m for m in managers if isinstance(m, RunsProbes)]
    if containers:
        container = containers[0]  # a container service is a group of its own (GpuHost.groups)

        def in_container(source: str, args: Sequence[str], timeout_s: float,
                         env: Mapping[str, str] | None) -> dict[str, Any]:
            return container.run_probe(source, args, timeout_s=timeout_s)

        return in_container

    def on_host(source: str, args: Sequence[str], timeout_s: float,
                env: Mapping[str, str] | None) -> dict[str, Any]:
        return host.transport.probe(source, args, python=host.profile.python, timeout_s=timeout_s, env=env,
                                    site=site)

    return on_host


def probe_source(name: str) -> str:
    """The text of probe script `name` (shipped as package data, never imported)."""
    return (resources.files("pytest_dflash.hostaccess") / "probes" / f"{name}.py").read_text(encoding="utf-8")


@dataclass
class GpuHost:
    host: HostContext
    options: GpuOptions = field(default_factory=GpuOptions)

    # ---- running probes -----------------------------------------------------------------------------

    @property
    def cache(self) -> dict[str, Any]:
        cache: dict[str, Any] = self.host.facts.gpu_probes
        return cache

    def probe(self, name: str, params: Mapping[str, Any] | None = None, *,
              env: Mapping[str, str] | None = None, key: str | None = None, timeout_s: float | None = None,
              group: ProbeGroup | None = None) -> dict[str, Any]:
        """Run probe `name` once per key, where `group` runs (`probe_runner`; no group: on the host); a
        transport failure is recorded as {"transport_error": ...}."""
        key = key or name
        if key in self.cache:
            result: dict[str, Any] = self.cache[key]
            return result
        limit = timeout_s or PROBE_TIMEOUTS_S.get(name, 120.0)
        try:
            runner = probe_runner(self.host, group, site=name not in SITELESS_PROBES)
            result = runner(probe_source(name), [json.dumps(dict(params or {}))], limit, env)
        except DflashError as exc:
            result = {"probe": name, "transport_error": str(exc)}
        self.cache[key] = result
        self._dump(key, result)
        return result

    def _dump(self, key: str, result: Mapping[str, Any]) -> None:
        if self.options.dump_dir is None:
            return
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.host.name)
        path = self.options.dump_dir / safe / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', key)}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")

    def export(self, key: str, value: Any) -> None:
        """Put a JSON-able fact into the host's verdict (host.facts.export)."""
        self.host.facts.export[key] = value

    # ---- what runs on the host --------------------------------------------------------------------------

    @cached_property
    def views(self) -> list[ServiceView]:
        views = []
        for spec in self.host.profile.services.values():
            view = service_view(self.host, spec)
            if view is not None:
                views.append(view)
        return views

    @cached_property
    def groups(self) -> list[ProbeGroup]:
        """Host services grouped by environment; each service whose probes run in its own environment (a
        container's: its image, its env) a group of its own."""
        on_host = [v for v in self.views if not v.own_environment]
        in_their_own = [g for v in self.views if v.own_environment for g in probe_groups([v])]
        return (probe_groups(on_host) if on_host else []) + in_their_own

    def group_key(self, probe: str, group: ProbeGroup) -> str:
        return probe if len(self.groups) == 1 else f"{probe}.{group.label}"

    def chains(self, group: ProbeGroup) -> list[Chain]:
        return chains_for(group.commands)

    @property
    def expected_gpus(self) -> tuple[int, ...]:
        """GPU indices the profile names (host.gpus and every service's gpus)."""
        indices = set(self.host.profile.gpus)
        for spec in self.host.profile.services.values():
            indices.update(spec.gpus)
        return tuple(sorted(indices))

    # ---- host layer -------------------------------------------------------------------------------------

    @cached_property
    def inventory(self) -> Inventory:
        raw = self.probe("gpu_inventory")
        if "transport_error" in raw:
            return Inventory(False, raw["transport_error"])
        return inventory_from_probe(raw)

    @property
    def has_gpu(self) -> bool:
        return self.inventory.available and bool(self.inventory.gpus)

    def no_gpu_reason(self) -> str:
        """Why this host has no GPU to check, for a "does not apply" skip. A host whose inventory probe could
        not run at all (ssh refused or timed out) was never shown to lack GPUs: its checks could not be made
        (a "could not check" skip, never a pass), naming the host and what the transport said; the host
        layer's reachability check is the one failure for that cause."""
        raw = self.probe("gpu_inventory")
        if "transport_error" in raw:
            could_not_check(explain(f"{self.host.name} could not be reached: the GPU inventory probe did not "
                                    "run", str(raw["transport_error"])))
        inv = self.inventory
        return (f"no GPU on {self.host.name}: {inv.reason}" if not inv.available
                else f"no GPU on {self.host.name}")

    def kernel_log(self) -> dict[str, Any]:
        return self.probe("kernel_log", {"pattern": KERNEL_PATTERN})

    # ---- env layer ----------------------------------------------------------------------------------------

    def torch_facts(self, group: ProbeGroup) -> dict[str, Any]:
        return self.probe("torch_facts", env=group.env, group=group, key=self.group_key("torch_facts", group))

    def import_chains(self, group: ProbeGroup) -> dict[str, Any]:
        chains = [{"name": c.name, "modules": list(c.modules)} for c in self.chains(group)]
        limit = self.options.chain_timeout_s
        return self.probe("import_chain", {"chains": chains, "timeout_s": limit, "parallel": 4},
                          env=group.env, group=group, key=self.group_key("import_chain", group),
                          timeout_s=limit + 60)

    def packages(self, group: ProbeGroup) -> dict[str, Any]:
        requirers = list(dict.fromkeys([*REQUIRERS, *PIN_REQUIRERS]))  # outlines: its outlines-core pin
        return self.probe("packages", {"requirers": requirers, "pip_check": True, "timeout_s": 180},
                          env=group.env, group=group, key=self.group_key("packages", group))

    def cuda_toolkit(self, group: ProbeGroup) -> dict[str, Any]:
        return self.probe("cuda_toolkit", env=group.env, group=group,
                          key=self.group_key("cuda_toolkit", group))

    def sgl_kernel_builds(self, group: ProbeGroup) -> dict[str, Any]:
        return self.probe("sgl_kernel_builds", env=group.env, group=group,
                          key=self.group_key("sgl_kernel_builds", group))

    def capabilities(self, group: ProbeGroup | None = None) -> list[tuple[int, int]]:
        """The GPU archs that matter: the GPUs present, else the configured JIT arch list."""
        if self.has_gpu:
            return self.inventory.capabilities
        from pytest_dflash.layers.gpu.arch import parse_arch_list

        configured = ((group.env.get("FLASHINFER_CUDA_ARCH_LIST") if group else None)
                      or self.options.jit_arch_list)
        return parse_arch_list(configured)

    def toolkit(self, group: ProbeGroup) -> ToolkitReport:
        torch = (self.torch_facts(group).get("torch") or {})
        versions = installed_versions(self.packages(group))
        raw = self.cuda_toolkit(group)
        return toolkit_report(raw, torch_cuda=torch.get("cuda"),
                              flashinfer_version=versions.get("flashinfer-python"),
                              capabilities=self.capabilities(group), ninja=raw.get("ninja"))

    # ---- kernels layer ------------------------------------------------------------------------------------

    @property
    def may_use_gpus(self) -> bool:
        """Whether the kernels layer may build and launch kernels here: when provisioning, or when
        opted in."""
        return self.host.provisioning or self.options.allow_gpu_use

    def gpu_use_refusal(self) -> str:
        """Why the kernels layer does not run on this host in attach mode (names the opt-in option)."""
        return (f"attach mode: the kernels layer would build and launch kernels on {self.host.name}'s GPUs "
                f"next to its running services; {opt_in_hint(ALLOW_GPU_USE_INI)}")

    def jit_cache(self, group: ProbeGroup) -> dict[str, Any]:
        params = {"user": group.user}  # the probe reads FLASHINFER_WORKSPACE_BASE from the service env itself
        return self.probe("jit_cache", params, env=group.env, group=group,
                          key=self.group_key("jit_cache", group))

    def kernels(self, step: str, group: ProbeGroup) -> dict[str, Any]:
        """Build (and on a GPU run) one kernel step on a cold cache, in the service's environment."""
        if not self.may_use_gpus:  # attach changes nothing unless asked: refuse before anything is sent
            raise DflashError(self.gpu_use_refusal())
        params: dict[str, Any] = {"step": step, "mode": "run" if self.has_gpu else "compile",
                                  "timeout_s": self.options.kernels_timeout_s}
        if not self.has_gpu:
            params["arch_list"] = group.env.get("FLASHINFER_CUDA_ARCH_LIST") or self.options.jit_arch_list
            if self.options.jit_objects:
                params["objects"] = list(self.options.jit_objects)
        if self.options.jit_jobs:
            params["jobs"] = self.options.jit_jobs
        return self.probe("kernels", params, env=group.env, group=group,
                          key=self.group_key(f"kernels_{step}", group),
                          timeout_s=self.options.kernels_timeout_s + 60)
