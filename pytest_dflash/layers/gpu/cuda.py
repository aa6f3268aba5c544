"""CUDA versions: the driver each CUDA runtime needs, and nvcc's version text.

Minimum Linux x86_64 driver per CUDA toolkit release (NVIDIA CUDA Toolkit release notes, table
"CUDA Toolkit and Corresponding Driver Versions"). Within one major release a newer runtime also
runs on an older driver of that major ("minor version compatibility", from 525.60.13 for 12.x and
580.65.06 for 13.x), except that PTX built by the newer toolkit cannot be JIT-compiled there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

DRIVER_FOR_CUDA: dict[str, str] = {
    "11.8": "520.61.05",
    "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06", "12.4": "550.54.14",
    "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03",
    "13.0": "580.65.06",
}
MINOR_COMPAT_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
_RELEASE = re.compile(r"release (\d+\.\d+),")


def driver_tuple(version: str) -> tuple[int, ...]:
    """'580.159.04' -> (580, 159, 4). ValueError for anything else."""
    parts = version.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a driver version: {version!r}")
    return tuple(int(p) for p in parts)


def nvcc_release(text: str) -> str | None:
    """`nvcc --version` output -> '13.0' (the 'release X.Y,' FlashInfer reads), or None."""
    match = _RELEASE.search(text)
    return match.group(1) if match else None


def driver_api_to_release(value: int) -> str:
    """cuDriverGetVersion()'s 13000 -> '13.0' (the newest CUDA the driver supports)."""
    return f"{value // 1000}.{(value % 1000) // 10}"


@dataclass(frozen=True)
class DriverCheck:
    runtime: str  # the CUDA release a build targets, e.g. torch.version.cuda
    driver: str
    needs_exact: str | None  # minimum driver for full support of this release (None: not in the table)
    needs_compat: str | None  # minimum driver for minor-version compatibility within the major
    ok: bool  # the runtime can run at all
    full: bool  # no minor-version-compatibility limits (PTX JIT of this release works)

    def describe(self) -> str:
        if not self.ok:
            needs = self.needs_compat or self.needs_exact
            if needs is None:
                return f"driver {self.driver} does not support CUDA {self.runtime} (it reports an older CUDA)"
            return f"driver {self.driver} is too old for CUDA {self.runtime}: it needs >= {needs}"
        if not self.full:
            return (f"driver {self.driver} runs CUDA {self.runtime} only through minor-version compatibility "
                    f"(full support needs >= {self.needs_exact}; PTX from this toolkit cannot be "
                    "JIT-compiled)")
        return f"driver {self.driver} supports CUDA {self.runtime}"


def check_driver(runtime: str, driver: str, driver_cuda: str | None = None) -> DriverCheck:
    """Is NVIDIA driver `driver` new enough for CUDA runtime `runtime` ('13.0')?

    `driver_cuda` is the newest CUDA the driver itself reports (nvidia-smi's cuda_version,
    cuDriverGetVersion); it decides for releases this table does not know yet.
    """
    try:
        release = Version(runtime)
    except InvalidVersion:
        raise ValueError(f"not a CUDA release: {runtime!r}") from None
    key = f"{release.major}.{release.minor}"
    have = driver_tuple(driver)
    exact = DRIVER_FOR_CUDA.get(key)
    compat = MINOR_COMPAT_DRIVER.get(release.major)
    if exact is None and compat is None and driver_cuda is not None:
        full = ok = Version(driver_cuda) >= Version(key)
        return DriverCheck(runtime=key, driver=driver, needs_exact=None, needs_compat=None, ok=ok, full=full)
    full = exact is not None and have >= driver_tuple(exact)
    ok = full or (compat is not None and have >= driver_tuple(compat))
    return DriverCheck(runtime=key, driver=driver, needs_exact=exact, needs_compat=compat, ok=ok, full=full)
