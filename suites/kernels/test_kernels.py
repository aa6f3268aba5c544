"""Kernels layer: do the JIT kernels build on a COLD cache and compute right on this GPU?

    pytest --host ct200 suites/kernels

Each build runs in an empty temporary FLASHINFER_WORKSPACE_BASE (removed afterwards) with the
service's own environment: a warm cache cannot hide a broken toolchain (seed 004). On a host without
a GPU only the compile (+ link) step runs, for --jit-arch-list (default 9.0); the checks that need
a GPU skip and say so.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from pytest_dflash.layers.gpu import GpuHost
from pytest_dflash.layers.gpu.checks import (
    decode_problems,
    installed_versions,
    sampling_problems,
    triton_problems,
    warm_cache_reliance,
)
from pytest_dflash.layers.gpu.hooks import KERNELS_PROPERTY
from pytest_dflash.layers.gpu.report import explain
from pytest_dflash.layers.gpu.services import ProbeGroup

pytestmark = [pytest.mark.kernels, pytest.mark.timeout(3600)]


class WarmCacheWarning(UserWarning):
    """The service's warm JIT cache holds modules this layer could not verify."""


def _group(gpu: GpuHost, package: str = "flashinfer-python") -> ProbeGroup:
    """The service group whose venv has `package` (a FlashInfer user first)."""
    if not gpu.host.has_host_access:
        pytest.skip("attached by URL: no host access")
    groups = sorted(gpu.groups, key=lambda g: "flashinfer" not in [c.name for c in gpu.chains(g)])
    for group in groups:
        if package in installed_versions(gpu.packages(group)):
            return group
    pytest.skip(f"{package} is not installed for {gpu.host.profile.python}")


def _record(request: pytest.FixtureRequest, gpu: GpuHost, module: str, result: dict[str, Any]) -> None:
    inner = result.get("result") or {}
    compile_ = inner.get("compile") or {}
    link = inner.get("link") or {}
    run = inner.get("run") or {}
    build_s = None
    if compile_.get("seconds") is not None:
        build_s = float(compile_["seconds"]) + float(link.get("seconds") or 0.0)
    outcome = "ok" if result.get("ok") else f"FAILED at {(inner.get('error') or {}).get('phase', 'probe')}"
    if compile_.get("skipped"):
        outcome, build_s = "not built (--jit-objects)", None
    if result.get("mode") == "compile":
        outcome += f" (compile only, {result.get('env', {}).get('FLASHINFER_CUDA_ARCH_LIST')})"
    entry = {"host": gpu.host.name, "module": module, "outcome": outcome, "build_s": build_s,
             "objects": compile_.get("objects") or [], "run_s": run.get("first_call_s"),
             "flashinfer": (inner.get("flashinfer") or {}).get("version")}
    request.node.user_properties.append((KERNELS_PROPERTY, entry))
    builds = dict(gpu.host.facts.get("export", {}).get("jit_builds", {}))
    builds[module] = {k: v for k, v in entry.items() if k != "host"}
    gpu.export("jit_builds", builds)


def _build_failure(result: dict[str, Any]) -> str | None:
    """The build log of a failed build (None when the build succeeded)."""
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
    return f"{error['phase']} failed: {error['type']}: {error['message']}\n{error.get('traceback', '')}\n{log}"


def _built(gpu: GpuHost, module: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    result = gpu.kernels(module, _group(gpu))
    if not any(key == KERNELS_PROPERTY and value.get("module") == module
               for key, value in request.node.user_properties):
        _record(request, gpu, module, result)
    return result


def _assert_built(gpu: GpuHost, module: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    result = _built(gpu, module, request)
    failure = _build_failure(result)
    inner = result.get("result") or {}
    skipped = (inner.get("compile") or {}).get("skipped")
    if failure is None and skipped:
        pytest.skip(f"--jit-objects: {skipped}")
    fi = inner.get("flashinfer") or {}
    where = (f"FlashInfer {fi.get('version')} JIT of {inner.get('spec_name') or module} for "
             f"{fi.get('target_archs')} with CUDA {fi.get('cuda_home')} ({fi.get('cuda_version')}) in an empty "
             f"workspace (services {_group(gpu).label})")
    if failure is not None:
        request.node.add_report_section("call", f"JIT build log ({module})", failure)  # whole, not truncated
    assert failure is None, explain(f"cold build failed: {where}", failure, values={"python": gpu.host.profile.python})
    assert result.get("workspace_removed"), f"the temporary workspace {result.get('workspace')} was not removed"
    return result


def _ran(gpu: GpuHost, module: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if not gpu.has_gpu:
        pytest.skip(gpu.no_gpu_reason() + ": only the compile step runs here")
    result = _built(gpu, module, request)
    if _build_failure(result) is not None:
        pytest.skip(f"the {module} module did not build (see test_flashinfer_{module}_builds_cold)")
    inner = result["result"]
    error = inner.get("error")
    assert error is None, explain(f"{module} built but failed when run on {gpu.host.name}",
                                  f"{error['type']}: {error['message']}\n{error.get('traceback', '')}")
    run: dict[str, Any] = inner["run"]
    return run


def test_flashinfer_sampling_builds_cold(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """FlashInfer's sampling module (sampling.cu, renorm.cu, binding) compiles and links from an empty cache."""
    _assert_built(dflash_gpu, "sampling", request)


def test_flashinfer_sampling_respects_top_k_top_p(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """top_k_top_p_sampling_from_probs draws only from the top-k then top-p set, with its frequencies."""
    run = _ran(dflash_gpu, "sampling", request)
    problems = sampling_problems(run)
    assert not problems, explain("FlashInfer sampling is wrong on this GPU", "\n".join(problems))


def test_flashinfer_decode_attention_builds_cold(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """FlashInfer's single-decode attention module (fp16, head_dim 128) compiles and links from an empty cache."""
    _assert_built(dflash_gpu, "decode", request)


def test_flashinfer_decode_attention_matches_sdpa(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """single_decode_with_kv_cache (GQA 32/8 heads, 1024 tokens) equals torch scaled_dot_product_attention."""
    run = _ran(dflash_gpu, "decode", request)
    problems = decode_problems(run)
    assert not problems, explain("FlashInfer decode attention is wrong on this GPU", "\n".join(problems))


def test_triton_kernel_compiles_and_runs(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """A Triton kernel compiles into an empty cache and computes x * 2 + y like torch."""
    if not dflash_gpu.has_gpu:
        pytest.skip(dflash_gpu.no_gpu_reason() + ": Triton compiles for the GPU it runs on")
    group = _group(dflash_gpu, "triton")
    result = dflash_gpu.kernels("triton", group)
    _record(request, dflash_gpu, "triton", result)
    failure = _build_failure(result)
    inner = result.get("result") or {}
    if failure is None and inner.get("error"):
        error = inner["error"]
        failure = f"{error['type']}: {error['message']}\n{error.get('traceback', '')}"
    assert failure is None, explain(f"Triton {(inner.get('triton') or {}).get('version')} failed", failure)
    problems = triton_problems(inner["run"])
    assert not problems, explain("Triton computes wrong results", "\n".join(problems))


def test_service_does_not_rely_on_warm_jit_cache(dflash_gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """The service's real FlashInfer cache holds no module for this GPU that a cold build cannot produce.

    A warm cache keeps a service with a broken toolchain alive until a reboot, upgrade or new host
    (seed 004: healthy for weeks, dead on the first sampled request after the cache was gone).
    """
    group = _group(dflash_gpu)
    cache = dflash_gpu.jit_cache(group)
    if "transport_error" in cache:
        pytest.fail(explain("the JIT cache probe could not run", cache["transport_error"]), pytrace=False)
    cold: dict[str, bool] = {}
    arch_dirs: set[str] = set()
    version = None
    for module in ("sampling", "decode"):
        result = _built(dflash_gpu, module, request)
        inner = result.get("result") or {}
        fi = inner.get("flashinfer") or {}
        version = fi.get("version") or version
        if fi.get("workspace_dir"):
            arch_dirs.add(str(fi["workspace_dir"]).rstrip("/").rsplit("/", 1)[-1])
        cold[str(inner.get("spec_name") or module)] = _build_failure(result) is None
    report = warm_cache_reliance(cache, flashinfer_version=version, arch_dirs=arch_dirs, cold=cold)
    held = [f"{m['version']}/{m['arch']}/{m['module']}" for m in cache.get("modules", []) if m.get("library")]
    summary = (f"warm cache {cache.get('base')}/.cache/flashinfer ({cache.get('base_source')}): "
               f"{', '.join(held) or 'empty'}; cold builds: {cold}")
    request.node.add_report_section("call", "warm JIT cache", summary)
    dflash_gpu.export("warm_jit_cache", {"base": cache.get("base"), "modules": held, "relied": report.relied,
                                         "unverified": report.unverified})
    if report.unverified:
        warnings.warn(WarmCacheWarning(f"{dflash_gpu.host.name}: the service's warm cache holds modules this layer "
                                       f"does not build cold: {', '.join(report.unverified)}"), stacklevel=1)
    assert not report.relied, explain(
        f"the service relies on its warm JIT cache for {', '.join(report.relied)}: the cold build of the same "
        "module FAILS, so the service breaks when the cache goes (reboot, upgrade, new host)", summary,
        diagnosis="sampling-jit-first-sampled-request" if any("sampling" in r for r in report.relied) else None)
