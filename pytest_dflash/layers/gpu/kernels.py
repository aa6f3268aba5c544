"""Kernels layer checks: do the JIT kernels build on a COLD cache and compute right on this GPU?

Each build runs in an empty temporary FLASHINFER_WORKSPACE_BASE (removed afterwards) with the service's
own environment: a warm cache cannot hide a broken toolchain (seed 004). On a host without a GPU only the
compile (+ link) step runs, for --jit-arch-list; the checks that need a GPU skip and say so.

In attach mode (no --provision) the builds and launches share the host's GPUs with its running services:
every check here skips, naming --allow-gpu-use, unless the user opted in. Each build runs once per host
and is recorded (a report property for the terminal summary, `jit_builds` in the verdict).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_dflash.layers.gpu.checks import (
    decode_problems,
    installed_versions,
    sampling_problems,
    triton_problems,
    warm_cache_reliance,
)
from pytest_dflash.layers.gpu.hooks import KERNELS_PROPERTY
from pytest_dflash.layers.gpu.layer import GpuHost
from pytest_dflash.layers.gpu.report import explain
from pytest_dflash.layers.gpu.services import ProbeGroup
from pytest_dflash.run import skips


class WarmCacheWarning(UserWarning):
    """The service's warm JIT cache holds modules this layer could not verify."""


# ---- the kernels probe's output, typed ---------------------------------------------------------------------


@dataclass(frozen=True)
class KernelBuild:
    """One kernels-probe run (a cold build, and on a GPU its first call) as the checks read it."""

    module: str
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def inner(self) -> Mapping[str, Any]:
        """What the probe's child reported (empty when it died before reporting)."""
        return self.raw.get("result") or {}

    @property
    def flashinfer(self) -> Mapping[str, Any]:
        return self.inner.get("flashinfer") or {}

    @property
    def spec_name(self) -> str:
        """FlashInfer's name of the module (the warm cache's directory name), else the step's."""
        return str(self.inner.get("spec_name") or self.module)

    @property
    def skipped(self) -> str | None:
        """Why the compile step did not build (--jit-objects), or None."""
        skipped = (self.inner.get("compile") or {}).get("skipped")
        return str(skipped) if skipped else None

    @property
    def failure(self) -> str | None:
        """The build log of a failed build; None when it built (a failing first call is `run_error`)."""
        result = self.raw
        if "transport_error" in result:
            return str(result["transport_error"])
        if result.get("timed_out"):
            return f"the build did not finish within the deadline\n{result.get('stderr', '')}"
        inner = result.get("result")
        if inner is None:
            return f"the build process died (exit {result.get('rc')}):\n{result.get('stderr', '')}"
        error = inner.get("error")
        if error is None or error.get("phase") == "run":
            return None
        log = error.get("log") or (inner.get("link") or {}).get("log") or ""
        return (f"{error['phase']} failed: {error['type']}: {error['message']}\n"
                f"{error.get('traceback', '')}\n{log}")

    @property
    def run_error(self) -> str | None:
        """The error of a module that built but failed when called, None otherwise."""
        error = self.inner.get("error")
        if error is None:
            return None
        return f"{error['type']}: {error['message']}\n{error.get('traceback', '')}"

    @property
    def run(self) -> dict[str, Any]:
        """What the first call measured (the probe's `run` object)."""
        run: dict[str, Any] = self.inner.get("run") or {}
        return run

    def record(self, host: str) -> dict[str, Any]:
        """The build's entry for the terminal summary and the verdict's `jit_builds`."""
        inner = self.inner
        compile_ = inner.get("compile") or {}
        link = inner.get("link") or {}
        run = inner.get("run") or {}
        build_s = None
        if compile_.get("seconds") is not None:
            build_s = float(compile_["seconds"]) + float(link.get("seconds") or 0.0)
        outcome = ("ok" if self.raw.get("ok")
                   else f"FAILED at {(inner.get('error') or {}).get('phase', 'probe')}")
        if compile_.get("skipped"):
            outcome, build_s = "not built (--jit-objects)", None
        if self.raw.get("mode") == "compile":
            outcome += f" (compile only, {self.raw.get('env', {}).get('FLASHINFER_CUDA_ARCH_LIST')})"
        return {"host": host, "module": self.module, "outcome": outcome, "build_s": build_s,
                "objects": compile_.get("objects") or [], "run_s": run.get("first_call_s"),
                "flashinfer": self.flashinfer.get("version")}


# ---- running the builds ---------------------------------------------------------------------------------


def require_gpu_use(gpu: GpuHost) -> None:
    """Skip without host access, and in attach mode unless --allow-gpu-use: nothing is built or launched."""
    if not gpu.host.has_host_access:
        skips.not_applicable("attached by URL: no host access")
    if not gpu.may_use_gpus:
        skips.not_applicable(gpu.gpu_use_refusal())


def service_group(gpu: GpuHost, package: str = "flashinfer-python") -> ProbeGroup:
    """The service group whose venv has `package` (a FlashInfer user first); skips when none has."""
    require_gpu_use(gpu)
    groups = sorted(gpu.groups, key=lambda g: "flashinfer" not in [c.name for c in gpu.chains(g)])
    for group in groups:
        if package in installed_versions(gpu.packages(group)):
            return group
    skips.not_applicable(f"{package} is not installed for {gpu.host.profile.python}")


def _record(request: pytest.FixtureRequest, gpu: GpuHost, build: KernelBuild) -> None:
    entry = build.record(gpu.host.name)
    request.node.user_properties.append((KERNELS_PROPERTY, entry))
    builds = dict(gpu.host.facts.export.get("jit_builds", {}))
    builds[build.module] = {k: v for k, v in entry.items() if k != "host"}
    gpu.export("jit_builds", builds)


def built(gpu: GpuHost, module: str, request: pytest.FixtureRequest) -> KernelBuild:
    """Build FlashInfer's `module` once per host (cold, in the service's environment), recorded once
    per test."""
    build = KernelBuild(module, gpu.kernels(module, service_group(gpu)))
    if not any(key == KERNELS_PROPERTY and value.get("module") == module
               for key, value in request.node.user_properties):
        _record(request, gpu, build)
    return build


def builds_cold(gpu: GpuHost, module: str, request: pytest.FixtureRequest) -> KernelBuild:
    """FlashInfer's `module` ("sampling", "decode") compiles and links from an empty cache, which is
    removed."""
    __tracebackhide__ = True
    build = built(gpu, module, request)
    failure = build.failure
    if failure is None and build.skipped:
        skips.not_applicable(f"--jit-objects: {build.skipped}")
    fi = build.flashinfer
    where = (f"FlashInfer {fi.get('version')} JIT of {build.inner.get('spec_name') or module} for "
             f"{fi.get('target_archs')} with CUDA {fi.get('cuda_home')} ({fi.get('cuda_version')}) in an "
             f"empty workspace (services {service_group(gpu).label})")
    if failure is not None:
        request.node.add_report_section("call", f"JIT build log ({module})", failure)  # whole, not truncated
    assert failure is None, explain(f"cold build failed: {where}", failure,
                                    values={"python": gpu.host.profile.python})
    assert build.raw.get("workspace_removed"), (f"the temporary workspace {build.raw.get('workspace')} was "
                                                "not removed")
    return build


def _ran(gpu: GpuHost, module: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """What the first call of a built `module` measured; skips without a GPU or when it did not build."""
    __tracebackhide__ = True
    require_gpu_use(gpu)
    if not gpu.has_gpu:
        skips.not_applicable(gpu.no_gpu_reason() + ": only the compile step runs here")
    build = built(gpu, module, request)
    if build.failure is not None:
        skips.could_not_check(f"the {module} module did not build (see test_flashinfer_{module}_builds_cold)")
    error = build.run_error
    assert error is None, explain(f"{module} built but failed when run on {gpu.host.name}", error)
    return build.run


# ---- the checks ------------------------------------------------------------------------------------------


def sampling_respects_top_k_top_p(gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """top_k_top_p_sampling_from_probs draws only from the top-k then top-p set, with its frequencies."""
    __tracebackhide__ = True
    problems = sampling_problems(_ran(gpu, "sampling", request))
    assert not problems, explain("FlashInfer sampling is wrong on this GPU", "\n".join(problems))


def decode_attention_matches_sdpa(gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """single_decode_with_kv_cache (GQA 32/8 heads, 1024 tokens) equals torch scaled_dot_product_attention."""
    __tracebackhide__ = True
    problems = decode_problems(_ran(gpu, "decode", request))
    assert not problems, explain("FlashInfer decode attention is wrong on this GPU", "\n".join(problems))


def triton_kernel_compiles_and_runs(gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """A Triton kernel compiles into an empty cache and computes x * 2 + y like torch."""
    __tracebackhide__ = True
    require_gpu_use(gpu)
    if not gpu.has_gpu:
        skips.not_applicable(gpu.no_gpu_reason() + ": Triton compiles for the GPU it runs on")
    build = KernelBuild("triton", gpu.kernels("triton", service_group(gpu, "triton")))
    _record(request, gpu, build)
    failure = build.failure
    if failure is None and build.inner.get("error"):
        failure = build.run_error
    assert failure is None, explain(f"Triton {(build.inner.get('triton') or {}).get('version')} failed",
                                    failure)
    problems = triton_problems(build.run)
    assert not problems, explain("Triton computes wrong results", "\n".join(problems))


def service_does_not_rely_on_warm_jit_cache(gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """The service's real FlashInfer cache holds no module for this GPU that a cold build cannot produce.

    A warm cache keeps a service with a broken toolchain alive until a reboot, upgrade or new host
    (seed 004: healthy for weeks, dead on the first sampled request after the cache was gone).
    """
    __tracebackhide__ = True
    group = service_group(gpu)
    cache = gpu.jit_cache(group)
    if "transport_error" in cache:
        pytest.fail(explain("the JIT cache probe could not run", cache["transport_error"]), pytrace=False)
    cold: dict[str, bool] = {}
    arch_dirs: set[str] = set()
    version = None
    for module in ("sampling", "decode"):
        build = built(gpu, module, request)
        version = build.flashinfer.get("version") or version
        if build.flashinfer.get("workspace_dir"):
            arch_dirs.add(str(build.flashinfer["workspace_dir"]).rstrip("/").rsplit("/", 1)[-1])
        cold[build.spec_name] = build.failure is None
    report = warm_cache_reliance(cache, flashinfer_version=version, arch_dirs=arch_dirs, cold=cold)
    held = [f"{m['version']}/{m['arch']}/{m['module']}" for m in cache.get("modules", []) if m.get("library")]
    summary = (f"warm cache {cache.get('base')}/.cache/flashinfer ({cache.get('base_source')}): "
               f"{', '.join(held) or 'empty'}; cold builds: {cold}")
    request.node.add_report_section("call", "warm JIT cache", summary)
    gpu.export("warm_jit_cache", {"base": cache.get("base"), "modules": held, "relied": report.relied,
                                  "unverified": report.unverified})
    if report.unverified:
        warnings.warn(WarmCacheWarning(f"{gpu.host.name}: the service's warm cache holds modules this layer "
                                       f"does not build cold: {', '.join(report.unverified)}"), stacklevel=2)
    assert not report.relied, explain(
        f"the service relies on its warm JIT cache for {', '.join(report.relied)}: the cold build of the "
        "same module FAILS, so the service breaks when the cache goes (reboot, upgrade, new host)", summary,
        diagnosis=("sampling-jit-first-sampled-request" if any("sampling" in r for r in report.relied)
                   else None))
