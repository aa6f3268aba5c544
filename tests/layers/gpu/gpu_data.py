"""Recorded real outputs for the GPU layers' self-tests (see tests/data/gpu/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from pytest_dflash.config.loader import load_profile
from pytest_dflash.layers.gpu.layer import GpuHost, GpuOptions
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun

DATA = Path(__file__).parents[2] / "data" / "gpu"
H200 = DATA / "h200"
CPU = DATA / "cpu-nvcc13"
REPO = Path(__file__).parents[3]
SUITES = REPO / "suites"


def load(path: Path | str) -> Any:
    """A recorded probe output (JSON), relative to tests/data/gpu/."""
    return json.loads((DATA / path).read_text(encoding="utf-8"))


def text(path: Path | str) -> str:
    return (DATA / path).read_text(encoding="utf-8", errors="replace")


PROBES = ("gpu_inventory", "kernel_log", "torch_facts", "import_chain", "packages", "cuda_toolkit",
          "sgl_kernel_builds", "jit_cache", "kernels_sampling", "kernels_decode", "kernels_triton")


def recorded(folder: str, **replaced: Any) -> dict[str, Any]:
    """The probe outputs recorded in tests/data/gpu/`folder`/, by probe cache key; `replaced` wins."""
    found = {name: load(f"{folder}/{name}.json") for name in PROBES if (DATA / folder / f"{name}.json").is_file()}
    return {**found, **replaced}


def recorded_gpu(profile: Path, probes: dict[str, Any], *, provision: bool = False, tmp_path: Path,
                 options: GpuOptions | None = None) -> GpuHost:
    """A real GpuHost of `profile` whose probe cache already holds `probes`: the layers read the recorded host.

    `provision` False is attach mode. A probe missing from `probes` would really run: `ran_nothing` checks.
    """
    host_profile = load_profile(profile)
    run = DflashRun({host_profile.name: host_profile}, RunOptions(provision=provision, report_dir=tmp_path), "rec")
    host = run.host(host_profile.name)
    host.facts.gpu_probes.update(probes)
    return GpuHost(host, options or GpuOptions())


def ran_nothing(gpu: GpuHost, probes: dict[str, Any]) -> bool:
    """No probe ran on this machine: the layers read only what was recorded."""
    return set(gpu.cache) == set(probes)


def venv_without(tmp_path: Path, *excluded: str) -> Path:
    """A real venv whose site-packages links every package of this venv except `excluded` (no copies, no fakes)."""
    target = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True, timeout=120)
    source = Path(sysconfig.get_paths()["purelib"])
    site = target / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for entry in source.iterdir():
        if not entry.name.lower().lstrip("_").startswith(excluded):
            (site / entry.name).symlink_to(entry)
    return target / "bin" / "python"
