"""pytest hooks of the GPU layers (host, env, kernels): options, the `dflash_gpu` fixture, env
snapshots and the kernels build-time summary. Registered through pytest_dflash.plugin.pytest_plugins.

    pytest --host ct200 suites/host suites/env suites/kernels
    pytest --host gpu-a suites/env --save-env-snapshot good.json     # a known-good host
    pytest --host gpu-b suites/env --env-baseline good.json          # fail on serving-stack drift
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config import options
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.layers.gpu.layer import ALLOW_GPU_USE_INI, GpuHost, GpuOptions
from pytest_dflash.layers.gpu.packages import write_snapshots
from pytest_dflash.run.state import HostContext

GPU_KEY = pytest.StashKey[dict[str, GpuHost]]()
OPTIONS_KEY = pytest.StashKey[GpuOptions]()
COLLECTOR_KEY = pytest.StashKey["GpuCollector"]()
SNAPSHOT_PROPERTY = "dflash_env_snapshot"
KERNELS_PROPERTY = "dflash_kernels"


def options_from_config(config: pytest.Config) -> GpuOptions:
    from pytest_dflash.layers.gpu.arch import parse_arch_list

    arch_list = options.text(config, "dflash_jit_arch_list") or "9.0"
    try:
        parse_arch_list(arch_list)
    except ValueError as exc:
        raise pytest.UsageError(f"--jit-arch-list / dflash_jit_arch_list: {exc}") from None
    objects = tuple(part.strip() for part in options.text(config, "dflash_jit_objects").split(",")
                    if part.strip())
    return GpuOptions(dump_dir=options.path(config, "dflash_probe_dump"), jit_arch_list=arch_list,
                      jit_objects=objects,
                      jit_jobs=options.number(config, "dflash_jit_jobs", int, None, low=1),
                      kernels_timeout_s=options.duration(config, "dflash_kernels_timeout", "25m") or 1500.0,
                      baseline=options.path(config, "dflash_env_baseline", must_exist=True),
                      allow_gpu_use=options.flag(config, ALLOW_GPU_USE_INI))


def pytest_configure(config: pytest.Config) -> None:
    config.stash[OPTIONS_KEY] = options_from_config(config)
    config.stash[GPU_KEY] = {}
    if not hasattr(config, "workerinput"):
        collector = GpuCollector(options.path(config, "dflash_save_env_snapshot"))
        config.stash[COLLECTOR_KEY] = collector
        config.pluginmanager.register(collector, "dflash-gpu-collector")


def gpu_host(config: pytest.Config, host: HostContext) -> GpuHost:
    """The one GpuHost of `host` in this process (its probes run once)."""
    hosts = config.stash[GPU_KEY]
    if host.name not in hosts:
        hosts[host.name] = GpuHost(host, config.stash[OPTIONS_KEY])
    return hosts[host.name]


def inventory_probe(config: pytest.Config) -> Callable[[HostContext], None]:
    """For the fleet pre-flight (run/preflight.py): the GPU inventory of a host with host access, probed now
    so the hosts' probes overlap; the host layer's tests read the cached result (or its recorded transport
    error)."""

    def probe(host: HostContext) -> None:
        # The raw probe, not GpuHost.inventory: before 3.12 a cached_property computes under one lock shared
        # by every instance, which would run the hosts' probes one after another. inventory parses this cache.
        if host.has_host_access:
            gpu_host(config, host).probe("gpu_inventory")

    return probe


@pytest.fixture
def dflash_gpu(request: pytest.FixtureRequest, dflash_host: HostContext) -> GpuHost:
    """The host under test as the host/env/kernels layers see it (probes run once per host)."""
    return gpu_host(request.config, dflash_host)


class GpuCollector:
    """Controller side: env snapshots and kernel build times arrive as report properties (xdist-safe)."""

    def __init__(self, snapshot_path: Path | None) -> None:
        self.snapshot_path = snapshot_path
        self.snapshots: dict[str, Any] = {}
        self.kernels: dict[tuple[str, str], dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == SNAPSHOT_PROPERTY and isinstance(value, dict):
                self.snapshots[value["host"]] = value["snapshot"]
            elif key == KERNELS_PROPERTY and isinstance(value, dict):
                self.kernels.setdefault((value["host"], value["module"]), value)

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Generator[None, None, None]:
        if self.snapshot_path is not None and self.snapshots:
            write_snapshots(self.snapshot_path, self.snapshots)
        yield

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.kernels and not (self.snapshot_path and self.snapshots):
            return
        terminalreporter.section("dflash gpu layers")
        for entry in self.kernels.values():
            parts = [f"cold JIT {entry['host']} {entry['module']}: {entry['outcome']}"]
            if entry.get("build_s") is not None:
                parts.append(f"build {format_seconds(entry['build_s'])}")
            if entry.get("objects"):
                parts.append("(" + ", ".join(f"{o['output']} {format_seconds(o['seconds'])}"
                                             for o in entry["objects"]) + ")")
            if entry.get("run_s") is not None:
                parts.append(f"first call {format_seconds(entry['run_s'])}")
            terminalreporter.write_line(" ".join(parts))
        if self.snapshot_path and self.snapshots:
            terminalreporter.write_line(f"env snapshot of {', '.join(sorted(self.snapshots))}: "
                                        f"{self.snapshot_path}")
