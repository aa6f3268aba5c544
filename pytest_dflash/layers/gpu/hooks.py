"""pytest hooks of the GPU layers (host, env, kernels): options, the `dflash_gpu` fixture, env
snapshots and the kernels build-time summary. Registered through pytest_dflash.plugin.pytest_plugins.

    pytest --host ct200 suites/host suites/env suites/kernels
    pytest --host gpu-a suites/env --save-env-snapshot good.json     # a known-good host
    pytest --host gpu-b suites/env --env-baseline good.json          # fail on serving-stack drift
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.durations import format_seconds, parse_seconds
from pytest_dflash.config.options import option, option_text
from pytest_dflash.layers.gpu.layer import ALLOW_GPU_USE_FLAG, ALLOW_GPU_USE_INI, GpuHost, GpuOptions
from pytest_dflash.layers.gpu.packages import write_snapshots

SAVE_SNAPSHOT_HELP = "write the env layer's package/driver snapshot of every host to FILE (JSON)"
BASELINE_HELP = "fail the env layer when a host's serving stack differs from the snapshot in FILE"
PROBE_DUMP_HELP = "write every probe's raw JSON output under DIR/<host>/ (evidence, test data)"
JIT_ARCH_HELP = ("FLASHINFER_CUDA_ARCH_LIST for the kernels layer's compile step on hosts without a GPU "
                 "(default '9.0'; the service's own FLASHINFER_CUDA_ARCH_LIST wins)")
JIT_OBJECTS_HELP = ("compile only these sources of each FlashInfer module on hosts without a GPU, e.g. 'renorm' "
                    "(comma-separated; a cheaper compile-only check, no link)")
JIT_JOBS_HELP = "parallel compile jobs for the kernels layer's JIT builds (default: ninja's, or MAX_JOBS)"
KERNELS_TIMEOUT_HELP = "deadline for one cold JIT build + run in the kernels layer (default 25m)"
ALLOW_GPU_USE_HELP = ("let the kernels layer build and launch kernels on the host's GPUs in attach mode (next to the "
                      "running services); without it those tests skip. With --provision they always run")

GPU_KEY = pytest.StashKey[dict[str, GpuHost]]()
OPTIONS_KEY = pytest.StashKey[GpuOptions]()
COLLECTOR_KEY = pytest.StashKey["GpuCollector"]()
SNAPSHOT_PROPERTY = "dflash_env_snapshot"
KERNELS_PROPERTY = "dflash_kernels"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dflash")
    group.addoption("--save-env-snapshot", dest="dflash_save_env_snapshot", default=None, metavar="FILE",
                    help=SAVE_SNAPSHOT_HELP)
    group.addoption("--env-baseline", dest="dflash_env_baseline", default=None, metavar="FILE", help=BASELINE_HELP)
    group.addoption("--dflash-probe-dump", dest="dflash_probe_dump", default=None, metavar="DIR",
                    help=PROBE_DUMP_HELP)
    group.addoption("--jit-arch-list", dest="dflash_jit_arch_list", default=None, metavar="LIST", help=JIT_ARCH_HELP)
    group.addoption("--jit-objects", dest="dflash_jit_objects", default=None, metavar="NAMES", help=JIT_OBJECTS_HELP)
    group.addoption("--jit-jobs", dest="dflash_jit_jobs", default=None, metavar="N", help=JIT_JOBS_HELP)
    group.addoption("--kernels-timeout", dest="dflash_kernels_timeout", default=None, metavar="DURATION",
                    help=KERNELS_TIMEOUT_HELP)
    group.addoption(ALLOW_GPU_USE_FLAG, action="store_true", dest=ALLOW_GPU_USE_INI, default=None,
                    help=ALLOW_GPU_USE_HELP)
    parser.addini("dflash_save_env_snapshot", SAVE_SNAPSHOT_HELP, default="")
    parser.addini("dflash_env_baseline", BASELINE_HELP, default="")
    parser.addini("dflash_probe_dump", PROBE_DUMP_HELP, default="")
    parser.addini("dflash_jit_arch_list", JIT_ARCH_HELP, default="9.0")
    parser.addini("dflash_jit_objects", JIT_OBJECTS_HELP, default="")
    parser.addini("dflash_jit_jobs", JIT_JOBS_HELP, default="")
    parser.addini("dflash_kernels_timeout", KERNELS_TIMEOUT_HELP, default="25m")
    parser.addini(ALLOW_GPU_USE_INI, ALLOW_GPU_USE_HELP, type="bool", default=False)


def _path(config: pytest.Config, name: str) -> Path | None:
    raw = option_text(config, name)
    if not raw:
        return None
    path = Path(raw).expanduser()
    return path if path.is_absolute() else config.invocation_params.dir / path


def options_from_config(config: pytest.Config) -> GpuOptions:
    from pytest_dflash.layers.gpu.arch import parse_arch_list

    arch_list = option_text(config, "dflash_jit_arch_list") or "9.0"
    try:
        parse_arch_list(arch_list)
    except ValueError as exc:
        raise pytest.UsageError(f"--jit-arch-list / dflash_jit_arch_list: {exc}") from None
    jobs_raw = option_text(config, "dflash_jit_jobs")
    if jobs_raw and (not jobs_raw.isdigit() or int(jobs_raw) < 1):
        raise pytest.UsageError(f"--jit-jobs / dflash_jit_jobs: {jobs_raw!r} is not a positive integer")
    try:
        timeout = parse_seconds(option_text(config, "dflash_kernels_timeout") or "25m",
                                where="--kernels-timeout / dflash_kernels_timeout")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    baseline = _path(config, "dflash_env_baseline")
    if baseline is not None and not baseline.is_file():
        raise pytest.UsageError(f"--env-baseline / dflash_env_baseline: {baseline} does not exist")
    objects = tuple(part.strip() for part in option_text(config, "dflash_jit_objects").split(",") if part.strip())
    return GpuOptions(dump_dir=_path(config, "dflash_probe_dump"), jit_arch_list=arch_list, jit_objects=objects,
                      jit_jobs=int(jobs_raw) if jobs_raw else None, kernels_timeout_s=timeout, baseline=baseline,
                      allow_gpu_use=bool(option(config, ALLOW_GPU_USE_INI)))


def pytest_configure(config: pytest.Config) -> None:
    config.stash[OPTIONS_KEY] = options_from_config(config)
    config.stash[GPU_KEY] = {}
    if not hasattr(config, "workerinput"):
        collector = GpuCollector(_path(config, "dflash_save_env_snapshot"))
        config.stash[COLLECTOR_KEY] = collector
        config.pluginmanager.register(collector, "dflash-gpu-collector")


@pytest.fixture
def dflash_gpu(request: pytest.FixtureRequest, dflash_host: Any) -> GpuHost:
    """The host under test as the host/env/kernels layers see it (probes run once per host)."""
    hosts = request.config.stash[GPU_KEY]
    if dflash_host.name not in hosts:
        hosts[dflash_host.name] = GpuHost(dflash_host, request.config.stash[OPTIONS_KEY])
    return hosts[dflash_host.name]


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
            terminalreporter.write_line(f"env snapshot of {', '.join(sorted(self.snapshots))}: {self.snapshot_path}")
