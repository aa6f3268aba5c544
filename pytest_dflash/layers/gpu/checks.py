"""Pure checks over probe results: each returns what is wrong (empty = fine), with the evidence.

The suites stay thin: they fetch probe results for a host and assert that these lists are empty.
Everything here is unit-tested against outputs recorded on real hosts (tests/data/gpu/).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion

from pytest_dflash.layers.gpu.arch import (
    Coverage,
    FlashinferTarget,
    coverage,
    flashinfer_eligible,
    flashinfer_target,
    sgl_kernel_build,
)
from pytest_dflash.layers.gpu.chains import GrammarBackend, Pin
from pytest_dflash.layers.gpu.packages import (
    PipIssue,
    RequirementIssue,
    check_requirements,
    normalize,
    parse_pip_check,
)
from pytest_dflash.layers.gpu.smi import Gpu

# ---- host ----------------------------------------------------------------------------------------

KERNEL_CATEGORIES: dict[str, re.Pattern[str]] = {
    "gpu-fallen-off-bus": re.compile(r"fallen off the bus"),
    "gpu-xid": re.compile(r"NVRM: Xid \("),
    "oom-killer": re.compile(r"Out of memory: Killed process|oom-kill:|invoked oom-killer|"
                             r"oom_reaper: reaped"),
}
KERNEL_PATTERN = r"NVRM: Xid|fallen off the bus|Out of memory|oom-kill|invoked oom-killer|oom_reaper"
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def classify_kernel_lines(lines: Iterable[str]) -> dict[str, list[str]]:
    """Kernel-log lines -> {category: lines}; only categories with lines."""
    found: dict[str, list[str]] = {}
    for line in lines:
        for category, pattern in KERNEL_CATEGORIES.items():
            if pattern.search(line):
                found.setdefault(category, []).append(line)
                break
    return found


_MEMCG_KILL = re.compile(r"Memory cgroup out of memory: Killed process|constraint=CONSTRAINT_MEMCG")


def split_oom_kills(lines: Iterable[str]) -> tuple[list[str], list[str]]:
    """OOM-killer lines -> (host-wide ones, memory-cgroup ones). A memory-cgroup kill is a container's or
    unit's own limit (the kernel says 'Memory cgroup out of memory' / constraint=CONSTRAINT_MEMCG): the
    workload that hit it, not the host, ran out of memory; a host-wide kill means the whole machine did."""
    host_wide: list[str] = []
    memcg: list[str] = []
    for line in lines:
        if not KERNEL_CATEGORIES["oom-killer"].search(line):
            continue
        if _MEMCG_KILL.search(line):
            memcg.append(line)
        elif "Killed process" in line or "constraint=" in line:
            host_wide.append(line)
    return host_wide, memcg


def xid_codes(lines: Iterable[str]) -> list[tuple[str, int]]:
    """(PCI address, Xid code) of every Xid line."""
    return [(m.group(1), int(m.group(2))) for line in lines if (m := _XID.search(line))]


def gpu_health(gpu: Gpu) -> list[str]:
    """Problems nvidia-smi reports for one GPU (ECC, retired pages, row remapping)."""
    problems = []
    if gpu.ecc_uncorrected_volatile:
        problems.append(f"{gpu.label}: {gpu.ecc_uncorrected_volatile} uncorrectable ECC errors since the "
                        "last driver load (volatile)")
    if gpu.retired_pending:
        problems.append(f"{gpu.label}: memory pages are pending retirement (a reset/reboot is needed)")
    if gpu.remap_pending:
        problems.append(f"{gpu.label}: a memory row remapping is pending (a GPU reset is needed)")
    if gpu.remap_failure:
        problems.append(f"{gpu.label}: a memory row remapping FAILED (the GPU needs replacement)")
    return problems


# ---- env: torch and the driver -----------------------------------------------------------------


def torch_coverage(arch_list: Sequence[str], capabilities: Iterable[tuple[int, int]]) -> list[Coverage]:
    """Coverage of every GPU capability by torch's arch list."""
    return [coverage(arch_list, cap) for cap in capabilities]


# ---- env: import chains ----------------------------------------------------------------------------

PACKAGE_OF_MODULE = {"soundfile": "soundfile", "xgrammar": "xgrammar", "sgl_kernel": "sglang-kernel",
                     "flashinfer": "flashinfer-python", "torch": "torch", "triton": "triton",
                     "transformers": "transformers", "sglang": "sglang", "tvm_ffi": "apache-tvm-ffi"}


@dataclass(frozen=True)
class ChainFailure:
    chain: str
    module: str | None
    error: str  # "ModuleNotFoundError: No module named 'soundfile'"
    package: str | None  # the distribution to fix
    traceback: str
    stderr: str

    def evidence(self) -> str:
        parts = [f"import chain {self.chain!r} failed at {self.module or '(interpreter died)'}: {self.error}"]
        if self.package:
            parts.append(f"package to fix: {self.package}")
        if self.traceback:
            parts.append("--- traceback (last lines) ---\n" + self.traceback)
        if self.stderr.strip() and self.stderr.strip() not in self.traceback:
            parts.append("--- stderr (tail) ---\n" + "\n".join(self.stderr.strip().splitlines()[-15:]))
        return "\n".join(parts)


def chain_result(probe: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((c for c in probe.get("chains", []) if c.get("name") == name), None)


SHARED_OBJECT_FAILURE = re.compile(r"cannot open shared object file|undefined symbol|wrong ELF class")
IMPORT_STATEMENT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.MULTILINE)


def chain_failure(result: Mapping[str, Any]) -> ChainFailure | None:
    """One chain of the import_chain probe -> its failure, or None when it imported."""
    if result.get("ok"):
        return None
    if result.get("timed_out"):
        return ChainFailure(result["name"], None, f"timed out after {result.get('seconds')} s", None, "",
                            result.get("stderr", ""))
    failed = result.get("failed") or {}
    missing = failed.get("missing")
    package = None
    message = str(failed.get("message", ""))
    symbol = re.search(r"cannot import name '[^']+' from '([\w.]+)'", message)
    top = (missing or (symbol.group(1) if symbol else None) or failed.get("module") or "").split(".")[0]
    if "undefined symbol" in message and "sgl_kernel" in (message + str(failed.get("traceback", ""))):
        top = "sgl_kernel"
    elif missing and "." not in missing and SHARED_OBJECT_FAILURE.search(message):
        # an extension that could not be loaded (torch's `_C` without libcudnn): ImportError.name is its bare
        # name, so the package is the one whose import statement failed, the traceback's last one
        statements = IMPORT_STATEMENT.findall(str(failed.get("traceback", "")))
        if statements:
            top = next(name for name in statements[-1] if name).split(".")[0]
    package = PACKAGE_OF_MODULE.get(top) or (failed.get("owners") or [None])[0] or (top or None)
    return ChainFailure(result["name"], failed.get("module"), f"{failed.get('type')}: {message}", package,
                        str(failed.get("traceback", "")), str(result.get("stderr", "")))


# ---- env: the grammar backend's version ------------------------------------------------------------------


def pin_problems(flag: str, backend: GrammarBackend, packages: Mapping[str, Any]) -> list[str]:
    """One line per module of the backend whose installed version is missing or outside the required range,
    naming the flag, the module, the found and the required version."""
    installed = installed_versions(packages)
    problems = []
    for pin in backend.pins:
        requirement, source = _required(pin, packages)
        have = installed.get(pin.distribution)
        if have is None:
            problems.append(f"{flag}: module {pin.module} is not installed (no {pin.distribution} "
                            f"distribution); {source} requires {requirement}")
        elif not _contains(Requirement(requirement).specifier, have):
            problems.append(f"{flag}: module {pin.module} is {pin.distribution} {have}; {source} requires "
                            f"{requirement}")
    return problems


def _required(pin: Pin, packages: Mapping[str, Any]) -> tuple[str, str]:
    """The requirement on the pin's distribution and who states it: the installed requirer's Requires-Dist
    line where the packages probe read one, else the pin SGLang 0.5.17 (or its outlines 0.1.11) has."""
    environment = {**packages.get("marker_env", {}), "extra": ""}
    for line in (packages.get("requires") or {}).get(pin.through) or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        applies = req.marker is None or req.marker.evaluate(environment)
        if normalize(req.name) == pin.distribution and applies:
            version = installed_versions(packages).get(pin.through)
            return f"{pin.distribution}{req.specifier}", f"{pin.through} {version}"
    stated = "sglang 0.5.17" if pin.through == "sglang" else f"{pin.through} as sglang 0.5.17 pins it"
    return pin.requirement, stated


def _contains(specifier: SpecifierSet, version: str) -> bool:
    try:
        return specifier.contains(version, prereleases=True)
    except InvalidVersion:
        return False


# ---- env: package metadata ---------------------------------------------------------------------------


def installed_versions(packages: Mapping[str, Any]) -> dict[str, str]:
    return {name: info["version"] for name, info in packages.get("distributions", {}).items()}


def requirement_issues(packages: Mapping[str, Any], requirers: Iterable[str]) -> list[RequirementIssue]:
    installed = installed_versions(packages)
    issues: list[RequirementIssue] = []
    for requirer in requirers:
        lines = packages.get("requires", {}).get(requirer)
        if lines is None:
            continue
        issues += check_requirements(requirer, lines, installed, packages.get("marker_env", {}))
    return issues


def pip_check_issues(packages: Mapping[str, Any]) -> tuple[list[PipIssue], list[str]]:
    check = packages.get("pip_check") or {}
    if not check.get("ran"):
        return [], []
    return parse_pip_check(str(check.get("stdout", "")))


def pip_conflicts(packages: Mapping[str, Any]) -> tuple[list[PipIssue], list[str]]:
    """Serving-stack version conflicts from `pip check`, re-judged with the versions that import.

    pip reads every copy of a distribution on sys.path; with a PYTHONPATH overlay it can report a
    conflict against the shadowed copy. A conflict the importable version satisfies is only a note.
    Returns (conflicts, notes).
    """
    issues, other = pip_check_issues(packages)
    effective = installed_versions(packages)
    conflicts: list[PipIssue] = []
    notes = list(other)
    for issue in issues:
        if not (issue.serving and issue.installed is not None):
            notes.append(issue.text)
            continue
        try:
            req = Requirement(issue.requirement)
        except InvalidRequirement:
            conflicts.append(issue)
            continue
        have = effective.get(normalize(req.name))
        if have is not None and have != issue.installed and req.specifier.contains(have, prereleases=True):
            notes.append(f"{issue.text} (pip read a shadowed copy; the importable {req.name} is {have})")
            continue
        conflicts.append(issue)
    return conflicts, notes


def companion_mismatches(installed: Mapping[str, str]) -> list[str]:
    """flashinfer-cubin / flashinfer-jit-cache must match flashinfer-python (FlashInfer raises otherwise)."""
    main = installed.get("flashinfer-python")
    if main is None:
        return []
    problems = []
    cubin = installed.get("flashinfer-cubin")
    if cubin is not None and cubin != main:
        problems.append(f"flashinfer-cubin {cubin} != flashinfer-python {main}")
    jit_cache = installed.get("flashinfer-jit-cache")
    if jit_cache is not None and not jit_cache.startswith(main):
        problems.append(f"flashinfer-jit-cache {jit_cache} does not match flashinfer-python {main}")
    return problems


# ---- env: the CUDA toolkit FlashInfer uses ---------------------------------------------------------


@dataclass(frozen=True)
class ToolkitReport:
    home: str | None
    source: str | None
    nvcc: str | None
    release: str | None  # what FlashInfer will believe (nvcc, else torch.version.cuda)
    release_from: str  # "nvcc" | "torch.version.cuda (nvcc failed)" | "none"
    targets: tuple[FlashinferTarget, ...]
    eligible: bool
    headers: Mapping[str, str | None]
    libraries: Mapping[str, str | None]
    ninja: str | None
    other_toolkits: tuple[str, ...]

    def summary(self) -> str:
        arch = ", ".join(f"{t.capability[0]}.{t.capability[1]} -> {t.cache_dir or 'REJECTED'}"
                         for t in self.targets)
        return (f"CUDA home {self.home} (from {self.source}), nvcc {self.nvcc or 'missing'}, release "
                f"{self.release or '?'} (from {self.release_from}); targets: {arch or 'none'}")


def toolkit_report(toolkit: Mapping[str, Any], *, torch_cuda: str | None, flashinfer_version: str | None,
                   capabilities: Iterable[tuple[int, int]], ninja: str | None = None) -> ToolkitReport:
    resolution = toolkit.get("resolution") or {}
    nvcc = toolkit.get("nvcc") or {}
    release = nvcc.get("release")
    release_from = "nvcc"
    if release is None:
        release, release_from = ((torch_cuda, "torch.version.cuda (nvcc failed)") if torch_cuda
                                 else (None, "none"))
    targets = tuple(flashinfer_target(cap, release, flashinfer_version) for cap in capabilities)
    others = tuple(f"{t['home']} (nvcc {t.get('release')})" for t in toolkit.get("toolkits", [])
                   if t.get("release") and t.get("home") != resolution.get("home"))
    return ToolkitReport(
        home=resolution.get("home"), source=resolution.get("source"),
        nvcc=nvcc.get("path") if nvcc.get("exists") and nvcc.get("rc") == 0 else None,
        release=release, release_from=release_from, targets=targets, eligible=flashinfer_eligible(targets),
        headers=dict(toolkit.get("headers") or {}), libraries=dict(toolkit.get("libraries") or {}),
        ninja=ninja if ninja is not None else toolkit.get("ninja"), other_toolkits=others,
    )


def sgl_kernel_problems(builds: Mapping[str, Any], capabilities: Iterable[tuple[int, int]]) -> list[str]:
    """sgl_kernel needs a common_ops build for every GPU arch (sm90 on 9.0, sm100 elsewhere)."""
    if not builds.get("found"):
        return []
    problems = []
    for cap in sorted(set(capabilities)):
        build = sgl_kernel_build(cap)
        if not builds.get("builds", {}).get(build) and not builds.get("top_level"):
            have = ", ".join(sorted(k for k, v in builds.get("builds", {}).items() if v)) or "none"
            problems.append(f"compute capability {cap[0]}.{cap[1]} loads sgl_kernel/{build}/common_ops, "
                            f"which {builds.get('package_dir')} does not have (builds present: {have})")
    return problems


# ---- kernels -------------------------------------------------------------------------------------------

SAMPLING_MAX_TVD = 0.06  # 4000 draws over <= 16 tokens: sampling noise is ~0.02
DECODE_MAX_ABS_ERR = 2e-3  # fp16 output (fp32 accumulation) of values ~0.1: rounding is ~1e-4
TRITON_MAX_ABS_ERR = 1e-5


def sampling_problems(run: Mapping[str, Any]) -> list[str]:
    problems = []
    if run.get("control_violations", 0) == 0:
        problems.append("the negative control (unfiltered multinomial samples) never left the top-k/top-p "
                        "set: the reference set is wrong, so the check proves nothing")
    if run.get("violations"):
        problems.append(f"{run['violations']} of {run['rows'] * run['samples_per_row']} samples are outside "
                        f"the top-k={run['top_k']}/top-p={run['top_p']} set: {run.get('violation_examples')}")
    worst = max(run.get("tvd") or [0.0])
    if worst > SAMPLING_MAX_TVD:
        problems.append(f"sample frequencies differ from the renormalised top-k/top-p distribution: total "
                        f"variation {worst:.3f} > {SAMPLING_MAX_TVD} (per row: {run.get('tvd')})")
    return problems


def decode_problems(run: Mapping[str, Any]) -> list[str]:
    problems = []
    err = float(run.get("max_abs_err", float("inf")))
    if not err <= DECODE_MAX_ABS_ERR:
        problems.append(f"single_decode_with_kv_cache differs from torch SDPA by {err:.3g} (max abs) > "
                        f"{DECODE_MAX_ABS_ERR}; mean {run.get('mean_abs_err')}")
    if float(run.get("control_max_abs_err", 0.0)) <= DECODE_MAX_ABS_ERR:
        problems.append("the negative control (SDPA over the wrong heads) also matched: the comparison "
                        "proves nothing")
    return problems


def triton_problems(run: Mapping[str, Any]) -> list[str]:
    err = float(run.get("max_abs_err", float("inf")))
    return [] if err <= TRITON_MAX_ABS_ERR else [f"Triton add kernel differs from torch by {err:.3g}"]


@dataclass(frozen=True)
class WarmCache:
    relied: list[str]  # cached modules whose cold build FAILED: the service runs on borrowed time
    unverified: list[str]  # cached modules this layer does not build cold
    matching: list[str]  # cached modules whose cold build succeeded


def warm_cache_reliance(cache: Mapping[str, Any], *, flashinfer_version: str | None, arch_dirs: Iterable[str],
                        cold: Mapping[str, bool]) -> WarmCache:
    """Compare the service's warm JIT cache with what a cold build can produce.

    `cold` maps FlashInfer module name -> did the cold build succeed. A module is "relied on" when
    the warm cache has it for this FlashInfer version and arch but the cold build failed; every
    other cached module is unverified when the toolchain failed on anything.
    """
    arches = set(arch_dirs)
    relied, unverified, matching = [], [], []
    toolchain_broken = any(not ok for ok in cold.values())
    for entry in cache.get("modules", []):
        if (not entry.get("library") or entry.get("version") != flashinfer_version
                or entry.get("arch") not in arches):
            continue
        name = str(entry["module"])
        label = f"{entry['version']}/{entry['arch']}/{name}"
        if name in cold and not cold[name]:
            relied.append(label)
        elif name in cold:
            matching.append(label)
        elif toolchain_broken:
            relied.append(label + " (not built here, but the same toolchain failed)")
        else:
            unverified.append(label)
    return WarmCache(relied, unverified, matching)

