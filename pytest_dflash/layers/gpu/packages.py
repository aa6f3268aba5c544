"""Installed packages: Requires-Dist consistency, `pip check`, and env snapshots (save / diff).

The serving stack is what a mismatch of breaks inference: torch, sglang, sglang-kernel, the
FlashInfer trio, xgrammar, transformers, triton, the nvidia-* CUDA libraries, soundfile and
apache-tvm-ffi (FlashInfer and sgl_kernel load their JIT modules through it). A violated pin of a
serving-stack package fails; anything else is reported as a warning (a hand-staged venv rarely
carries every optional dependency sglang lists, and the import chain is the decisive check).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from pytest_dflash.documents import loads_json

SERVING_STACK = frozenset({
    "torch", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer-cubin",
    "flashinfer-jit-cache", "xgrammar", "transformers", "triton", "soundfile", "apache-tvm-ffi",
})
# nvidia-* wheels that are CUDA libraries (not nvidia-ml-py, the cutlass DSL, cudnn-frontend, ...)
_CUDA_LIB = re.compile(r"^nvidia-(cuda-|cublas|cudnn-cu|cufft|cufile|curand|cusolver|cusparse|nccl|nvjitlink|"
                       r"nvshmem|nvtx)")
SNAPSHOT_FORMAT = 1


def normalize(name: str) -> str:
    """PEP 503 name normalisation: 'Flashinfer_Python' -> 'flashinfer-python'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_serving(name: str) -> bool:
    name = normalize(name)
    return name in SERVING_STACK or bool(_CUDA_LIB.match(name))


@dataclass(frozen=True)
class RequirementIssue:
    requirer: str
    requirement: str  # as written in Requires-Dist
    name: str
    installed: str | None  # None = not installed
    serving: bool

    @property
    def kind(self) -> str:
        return "missing" if self.installed is None else "mismatch"

    def describe(self) -> str:
        if self.installed is None:
            return f"{self.requirer} requires {self.requirement}: not installed"
        return f"{self.requirer} requires {self.requirement}: {self.name} {self.installed} is installed"


def check_requirements(requirer: str, requires: Iterable[str], installed: Mapping[str, str],
                       marker_env: Mapping[str, str]) -> list[RequirementIssue]:
    """Requires-Dist lines of `requirer` vs installed versions (name -> version, normalised names)."""
    issues = []
    env = {**marker_env, "extra": ""}
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        try:
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # another platform, or an extra
        except UndefinedEnvironmentName:
            continue
        name = normalize(req.name)
        have = installed.get(name)
        text = line.split(";")[0].strip()
        if have is None:
            issues.append(RequirementIssue(requirer, text, name, None, is_serving(name)))
            continue
        try:
            ok = req.specifier.contains(Version(have), prereleases=True)
        except InvalidVersion:
            ok = req.specifier.contains(have, prereleases=True)
        if not ok:
            issues.append(RequirementIssue(requirer, text, name, have, is_serving(name)))
    return issues


# The torch each sglang-kernel build goes with: the torch the sglang releases that pin it pin too (read from
# the wheels, tests/data/sglang-versions/releases.toml). 0.4.5 and 0.4.6.post1 declare no torch of their own,
# so this pairing is the only record of the torch their compiled ops were built against; 0.4.7+ also pin it
# themselves.
KERNEL_TORCH = {
    "0.4.5": ("2.11", "sglang 0.5.17"),
    "0.4.6.post1": ("2.13", "sglang 0.5.18 and 0.5.19"),
    "0.4.7": ("2.13", "sglang 0.5.20 and 0.5.21"),
    "0.4.9": ("2.14", "sglang 0.5.22"),
    "0.4.10": ("2.14", "sglang 0.5.23"),
}


def kernel_torch_issue(installed: Mapping[str, str],
                       kernel_requires: Iterable[str] | None) -> RequirementIssue | None:
    """An sglang-kernel build whose paired torch (major.minor) is not the installed torch, when the kernel's
    own Requires-Dist does not say so already (its own torch pin is checked with the others)."""
    kernel, torch = installed.get("sglang-kernel"), installed.get("torch")
    if kernel not in KERNEL_TORCH or torch is None:
        return None
    for line in kernel_requires or ():
        try:
            if normalize(Requirement(line).name) == "torch":
                return None
        except InvalidRequirement:
            continue
    built, pairing = KERNEL_TORCH[kernel]
    try:
        have = ".".join(str(part) for part in Version(torch).release[:2])
    except InvalidVersion:
        return None
    if have == built:
        return None
    return RequirementIssue("sglang-kernel",
                            f"torch=={built}.* (built for the torch {pairing} pin with it; its "
                            "METADATA names no torch)", "torch", torch, True)


@dataclass(frozen=True)
class PipIssue:
    package: str
    version: str
    requirement: str
    installed: str | None  # None = "which is not installed"
    text: str

    @property
    def serving(self) -> bool:
        return is_serving(re.split(r"[\s<>=!~\[;(]", self.requirement, maxsplit=1)[0])


_HAS_REQ = re.compile(r"^(\S+) (\S+) has requirement (.+), but you have (\S+) (\S+?)\.?$")
_REQUIRES = re.compile(r"^(\S+) (\S+) requires (.+), which is not installed\.?$")


def parse_pip_check(text: str) -> tuple[list[PipIssue], list[str]]:
    """`pip check` output -> (parsed conflicts, lines it could not parse)."""
    issues: list[PipIssue] = []
    other: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        match = _HAS_REQ.match(line)
        if match:
            issues.append(PipIssue(match.group(1), match.group(2), match.group(3), match.group(5), line))
            continue
        match = _REQUIRES.match(line)
        if match:
            issues.append(PipIssue(match.group(1), match.group(2), match.group(3), None, line))
            continue
        other.append(line)
    return issues, other


# ---- env snapshots ------------------------------------------------------------------------------


def snapshot(packages: Mapping[str, Any], *, driver: str | None, torch_cuda: str | None) -> dict[str, Any]:
    """One host's env snapshot from the packages probe (every distribution, serving stack marked)."""
    dists = packages.get("distributions", {})
    return {
        "python": packages.get("marker_env", {}).get("python_full_version"),
        "driver": driver,
        "torch_cuda": torch_cuda,
        "packages": {name: info["version"] for name, info in sorted(dists.items())},
    }


@dataclass(frozen=True)
class Drift:
    name: str
    baseline: str | None
    current: str | None
    serving: bool

    def describe(self) -> str:
        return f"{self.name}: {self.baseline or 'absent'} -> {self.current or 'absent'}"


def diff(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> list[Drift]:
    """Differences between two snapshots; `serving` ones fail the env layer."""
    drifts = []
    for key in ("driver", "torch_cuda"):
        if baseline.get(key) != current.get(key):
            drifts.append(Drift(key, baseline.get(key), current.get(key), True))
    old = baseline.get("packages", {})
    new = current.get("packages", {})
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            drifts.append(Drift(name, old.get(name), new.get(name), is_serving(name)))
    return drifts


def write_snapshots(path: Path, hosts: Mapping[str, Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": SNAPSHOT_FORMAT, "hosts": dict(hosts)}, indent=1, sort_keys=True)
                    + "\n", encoding="utf-8")


def read_baseline(path: Path, host: str) -> Mapping[str, Any]:
    """The baseline for `host`: its own entry, or the only host in the file. ValueError otherwise."""
    try:
        data = loads_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError, JSONDecodeError, DocumentTooDeep
        raise ValueError(f"{path}: cannot read env snapshot: {exc}") from None
    if (not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT
            or not isinstance(data.get("hosts"), dict)):
        raise ValueError(f"{path}: not an env snapshot written by --save-env-snapshot (format "
                         f"{SNAPSHOT_FORMAT})")
    hosts: dict[str, Any] = data["hosts"]
    if host in hosts:
        return dict(hosts[host])
    if len(hosts) == 1:
        return dict(next(iter(hosts.values())))
    raise ValueError(f"{path}: no snapshot for host {host!r} (it has {', '.join(sorted(hosts))})")
