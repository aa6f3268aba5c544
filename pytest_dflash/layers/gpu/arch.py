"""GPU architectures: which builds run on which GPU, and what FlashInfer's JIT will target.

Names come in several spellings: torch's `sm_90` / `sm_120` / `compute_90`, FlashInfer's
`9.0a` / `12.0f` and cache directories `90a` / `120f`, nvidia-smi's `9.0`. The last digit of
`sm_XY` is the minor version (`sm_120` is 12.0, not 1.20 or 120).

Compatibility (CUDA C programming guide, "Binary compatibility"):
  * SASS `sm_XY` runs on GPUs of the same major X with minor >= Y;
  * `sm_XYa` (arch-specific) runs only on exactly X.Y; `sm_XYf` (family) on major X, minor >= Y;
  * PTX `compute_XY` is JIT-compiled by the driver for any GPU >= X.Y (`a` PTX only on X.Y).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

_TORCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")
_DOTTED = re.compile(r"^(\d+)\.(\d+)([af]?)$")

# The first CUDA toolkit whose nvcc can generate code for an architecture (major, minor).
NVCC_MIN_FOR_ARCH: dict[tuple[int, int], str] = {
    (7, 0): "9.0", (7, 5): "10.0", (8, 0): "11.0", (8, 6): "11.1", (8, 7): "11.4", (8, 9): "11.8",
    (9, 0): "11.8", (10, 0): "12.8", (10, 3): "12.9", (11, 0): "13.0", (12, 0): "12.8", (12, 1): "12.9",
}
# FlashInfer's SM 12.x rule (compilation_context.py _normalize_cuda_arch), read from the wheels:
# up to 0.7.0 every SM 12.x needs CUDA >= 12.9; from 0.7.1 SM 12.0 needs >= 12.8 ("12.0a" on 12.8).
FLASHINFER_SM120_RELAXED_FROM = Version("0.7.1")


@dataclass(frozen=True, order=True)
class Arch:
    """A compute capability with an optional target suffix ('a' arch-specific, 'f' family)."""

    major: int
    minor: int
    suffix: str = ""

    @property
    def capability(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def dotted(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return self.dotted


@dataclass(frozen=True)
class Target:
    """One entry of a build's arch list: machine code (SASS) or PTX for an Arch."""

    arch: Arch
    ptx: bool

    @property
    def name(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.arch.major}{self.arch.minor}{self.arch.suffix}"

    def runs_on(self, capability: tuple[int, int]) -> bool:
        """True when this target can execute on a GPU of `capability`."""
        major, minor = capability
        if self.arch.suffix == "a":
            return self.arch.capability == capability
        if self.arch.suffix == "f" or not self.ptx:
            return self.arch.major == major and self.arch.minor <= minor
        return self.arch.capability <= capability


def parse_target(text: str) -> Target:
    """'sm_90' / 'sm_90a' / 'compute_90' / 'sm_120' / '9.0' / '12.0f' -> Target. ValueError otherwise."""
    raw = text.strip()
    match = _TORCH.match(raw)
    if match:
        kind, major, minor, suffix = match.groups()
        return Target(Arch(int(major), int(minor), suffix), ptx=kind == "compute")
    match = _DOTTED.match(raw)
    if match:
        major, minor, suffix = match.groups()
        return Target(Arch(int(major), int(minor), suffix), ptx=False)
    raise ValueError(f"not a CUDA architecture: {text!r} (expected e.g. sm_90, compute_90, 9.0, 12.0f)")


def parse_capability(text: str) -> tuple[int, int]:
    """nvidia-smi's compute_cap '9.0' / '12.0' -> (9, 0) / (12, 0)."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    if not match:
        raise ValueError(f"not a compute capability: {text!r} (expected e.g. 9.0)")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class Coverage:
    capability: tuple[int, int]
    covered_by: str | None  # the first target that runs on it
    targets: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.covered_by is not None

    def describe(self) -> str:
        cap = f"{self.capability[0]}.{self.capability[1]}"
        if self.ok:
            return f"compute capability {cap} runs {self.covered_by}"
        return (f"compute capability {cap} has no machine code (SASS of major {self.capability[0]} with "
                f"minor <= {self.capability[1]}) and no lower-or-equal PTX in "
                f"[{', '.join(self.targets) or 'nothing'}]")


def coverage(arch_list: Iterable[str], capability: tuple[int, int]) -> Coverage:
    """Does a build with `arch_list` (e.g. torch.cuda.get_arch_list()) run on `capability`?"""
    names = tuple(arch_list)
    targets = [parse_target(name) for name in names]
    # Prefer machine code over PTX: PTX works, but is compiled by the driver at first use.
    for target in sorted(targets, key=lambda t: (t.ptx, -t.arch.minor)):
        if target.runs_on(capability):
            return Coverage(capability, target.name, names)
    return Coverage(capability, None, names)


@dataclass(frozen=True)
class FlashinferTarget:
    """What FlashInfer's JIT does for one GPU: the arch it compiles for, or why it drops the GPU."""

    capability: tuple[int, int]
    arch: Arch | None
    error: str | None  # FlashInfer's own message when the arch is rejected (then logged and dropped)
    needs_cuda: str | None  # the toolkit release this GPU needs under this FlashInfer version

    @property
    def cache_dir(self) -> str | None:
        """The <arch> component of FlashInfer's cache path, e.g. '90a', '120f'."""
        return f"{self.arch.major}{self.arch.minor}{self.arch.suffix}" if self.arch else None


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def flashinfer_target(capability: tuple[int, int], cuda_release: str | None,
                      flashinfer_version: str | None) -> FlashinferTarget:
    """FlashInfer's `_normalize_cuda_arch` for one GPU, given the CUDA release its JIT detects."""
    major, minor = capability
    cuda = _version(cuda_release)
    fi = _version(flashinfer_version)
    if major == 12:
        relaxed = fi is not None and fi >= FLASHINFER_SM120_RELAXED_FROM
        if minor == 0 and relaxed:
            if cuda is not None and cuda >= Version("12.9"):
                return FlashinferTarget(capability, Arch(12, 0, "f"), None, "12.8")
            if cuda is not None and cuda >= Version("12.8"):
                return FlashinferTarget(capability, Arch(12, 0, "a"), None, "12.8")
            return FlashinferTarget(capability, None, "SM 120 requires CUDA >= 12.8", "12.8")
        if cuda is not None and cuda >= Version("12.9"):
            return FlashinferTarget(capability, Arch(12, minor, "f" if minor == 0 else "a"), None, "12.9")
        message = "SM 12.1+ requires CUDA >= 12.9" if relaxed else "SM 12.x requires CUDA >= 12.9"
        return FlashinferTarget(capability, None, message, "12.9")
    if major == 9 or major >= 10:
        arch = Arch(major, minor, "a")
    else:
        arch = Arch(major, minor)
    needs = NVCC_MIN_FOR_ARCH.get(capability)
    if needs is not None and cuda is not None and cuda < Version(needs):
        return FlashinferTarget(capability, arch, f"nvcc {cuda_release} cannot generate code for {arch.sm} "
                                f"(needs CUDA >= {needs})", needs)
    return FlashinferTarget(capability, arch, None, needs)


def flashinfer_eligible(targets: Iterable[FlashinferTarget]) -> bool:
    """FlashInfer's check_cuda_arch(): False means "FlashInfer requires GPUs with sm75 or higher"."""
    for target in targets:
        if target.arch is None:
            continue
        if target.arch.major >= 8 or (target.arch.major == 7 and target.arch.minor >= 5):
            return True
    return False


def parse_arch_list(text: str) -> list[tuple[int, int]]:
    """FLASHINFER_CUDA_ARCH_LIST ('9.0 12.0f') -> capabilities [(9, 0), (12, 0)]."""
    return [parse_target(part).arch.capability for part in text.split()]


def sgl_kernel_build(capability: tuple[int, int]) -> str:
    """The sgl_kernel common_ops build directory loaded on this GPU (sglang-kernel 0.4.x load_utils)."""
    return "sm90" if capability == (9, 0) else "sm100"
