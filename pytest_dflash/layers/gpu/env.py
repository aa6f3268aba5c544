"""Env layer checks: can the server's venv run its serving stack on this host's GPUs? Nothing is started.

Each function is one check of suites/env (smoke runs a subset of the same functions): it skips with the
reason when the check cannot apply, and otherwise passes or raises AssertionError with the evidence
(`explain`). Every probe runs with the profile's python (the server's venv) and each service's own
environment (unit Environment= lines / profile env), so PYTHONPATH overlays and CUDA_HOME are the service's.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

# re-exported: suites parametrize over it
from pytest_dflash.layers.gpu.chains import ALL_CHAINS as ALL_CHAINS
from pytest_dflash.layers.gpu.chains import grammar_backends
from pytest_dflash.layers.gpu.checks import (
    chain_failure,
    chain_result,
    companion_mismatches,
    installed_versions,
    pin_problems,
    pip_conflicts,
    requirement_issues,
    sgl_kernel_problems,
    torch_coverage,
)
from pytest_dflash.layers.gpu.cuda import check_driver, driver_api_to_release
from pytest_dflash.layers.gpu.flags import NEWEST_READ, flag_findings, newer_than_read, runs_sglang
from pytest_dflash.layers.gpu.hooks import SNAPSHOT_PROPERTY
from pytest_dflash.layers.gpu.layer import REQUIRERS, GpuHost
from pytest_dflash.layers.gpu.packages import diff, is_serving, kernel_torch_issue, read_baseline, snapshot
from pytest_dflash.layers.gpu.report import explain
from pytest_dflash.layers.gpu.services import ProbeGroup
from pytest_dflash.run import skips


class EnvWarning(UserWarning):
    """An env finding that does not fail the layer (non-serving packages, unverified details)."""


# ---- what the checks read (each skips or fails with the reason when it cannot be read) -------------------


def probe_groups(gpu: GpuHost) -> list[ProbeGroup]:
    """The service groups to probe; skips without host access or without a service that has it."""
    if not gpu.host.has_host_access:
        skips.not_applicable("attached by URL: no host access")
    if not gpu.groups:
        skips.not_applicable(f"no service of {gpu.host.name} runs with host access")
    return gpu.groups


def _values(gpu: GpuHost) -> dict[str, str]:
    return {"python": gpu.host.profile.python}


def torch_of(gpu: GpuHost, group: ProbeGroup) -> dict[str, Any]:
    """torch's facts in the group's environment; fails when the probe cannot run or torch does not import."""
    raw = gpu.torch_facts(group)
    if "transport_error" in raw:
        pytest.fail(explain(f"the torch probe could not run with {gpu.host.profile.python}",
                            raw["transport_error"]),
                    pytrace=False)
    if raw.get("import_error"):
        pytest.fail(explain(f"torch does not import in {gpu.host.profile.python} (services {group.label})",
                            raw["import_error"], values=_values(gpu)), pytrace=False)
    facts: dict[str, Any] = raw["torch"]
    return facts


def packages_of(gpu: GpuHost, group: ProbeGroup) -> dict[str, Any]:
    """The packages probe of the group; fails when it cannot run."""
    raw = gpu.packages(group)
    if "transport_error" in raw:
        pytest.fail(explain("the packages probe could not run", raw["transport_error"]), pytrace=False)
    return raw


def groups_with_flashinfer(gpu: GpuHost) -> list[ProbeGroup]:
    """The groups whose venv has flashinfer-python; skips when none has (nothing JIT-compiles)."""
    groups = [g for g in probe_groups(gpu) if "flashinfer-python" in installed_versions(packages_of(gpu, g))]
    if not groups:
        skips.not_applicable(f"flashinfer-python is not installed for {gpu.host.profile.python}: "
                             "nothing JIT-compiles")
    return groups


# ---- the checks -------------------------------------------------------------------------------------------


def service_python_is_the_profiles(gpu: GpuHost) -> None:
    """The probes run the profile's python; a service that runs another interpreter would not be the one
    probed."""
    __tracebackhide__ = True
    probe_groups(gpu)
    python = gpu.host.profile.python
    others = [f"{v.name} ({v.source}) runs {v.argv[0]}" for v in gpu.views
              if v.argv and os.path.isabs(v.argv[0]) and "python" in os.path.basename(v.argv[0])
              and os.path.normpath(v.argv[0]) != os.path.normpath(python)]
    assert not others, explain(f"services run another interpreter than host.python = {python}: the env layer "
                               "would check the wrong venv; set host.python to the service's",
                               "\n".join(others))


def torch_imports(gpu: GpuHost) -> None:
    """torch imports in the server's venv (an undefined symbol here is a broken torch/CUDA overlay)."""
    for group in probe_groups(gpu):
        torch_of(gpu, group)


def torch_initialises_cuda(gpu: GpuHost) -> None:
    """On a GPU host, torch is a CUDA build and initialises CUDA (driver new enough, devices visible)."""
    __tracebackhide__ = True
    for group in probe_groups(gpu):
        facts = torch_of(gpu, group)
        if not gpu.has_gpu:
            skips.not_applicable(gpu.no_gpu_reason() + f" (torch {facts['version']}, CUDA {facts['cuda']})")
        gpu.export("torch", {k: facts.get(k) for k in ("version", "cuda", "arch_list", "devices")})
        evidence = "\n".join([str(w) for w in facts.get("warnings") or []]
                             + [str(facts.get("cuda_error") or "")])
        assert facts["cuda"], explain(f"torch {facts['version']} is a CPU build on a GPU host", evidence)
        assert facts["cuda_available"], explain(
            f"torch {facts['version']} (CUDA {facts['cuda']}) cannot initialise CUDA (services "
            f"{group.label})",
            evidence, values=_values(gpu))


def torch_arch_list_covers_gpus(gpu: GpuHost) -> None:
    """torch.cuda.get_arch_list() has SASS for, or a lower-or-equal PTX of, every GPU's compute capability."""
    __tracebackhide__ = True
    for group in probe_groups(gpu):
        facts = torch_of(gpu, group)
        if not gpu.has_gpu:
            skips.not_applicable(gpu.no_gpu_reason())
        arch_list = [str(a) for a in facts.get("arch_list") or []]
        gaps = [c.describe() for c in torch_coverage(arch_list, gpu.inventory.capabilities) if not c.ok]
        assert not gaps, explain(f"torch {facts['version']} has no kernels for this GPU: any CUDA op fails "
                                 "with 'no kernel image is available for execution on the device'",
                                 "\n".join(gaps), diagnosis="no-kernel-image")


def driver_supports_torch_cuda(gpu: GpuHost) -> None:
    """The NVIDIA driver is new enough for the CUDA release torch was built with."""
    __tracebackhide__ = True
    for group in probe_groups(gpu):
        facts = torch_of(gpu, group)
        if not gpu.has_gpu or not facts.get("cuda"):
            skips.not_applicable(gpu.no_gpu_reason() if not gpu.has_gpu else "torch is a CPU build")
        inventory = gpu.inventory
        api = facts.get("driver_api_version")
        driver_cuda = inventory.driver_cuda or (driver_api_to_release(int(str(api))) if api else None)
        assert inventory.driver, "nvidia-smi reported no driver version"
        check = check_driver(str(facts["cuda"]), inventory.driver, driver_cuda)
        assert check.ok, explain(check.describe(),
                                 f"driver {inventory.driver} (supports CUDA {driver_cuda}); "
                                 f"torch {facts['version']} built for CUDA {facts['cuda']}",
                                 diagnosis="cuda-driver-too-old")
        if not check.full:
            warnings.warn(EnvWarning(f"{gpu.host.name}: {check.describe()}"), stacklevel=2)


def import_chain(gpu: GpuHost, chain: str) -> None:
    """The serving chain imports in a fresh interpreter of the server's venv, in the service's environment; a
    grammar backend's chain also at the version SGLang requires of it (one line per module that is not)."""
    __tracebackhide__ = True
    ran = False
    for group in probe_groups(gpu):
        if chain not in [c.name for c in gpu.chains(group)]:
            continue
        ran = True
        raw = gpu.import_chains(group)
        if "transport_error" in raw:
            pytest.fail(explain("the import-chain probe could not run", raw["transport_error"]),
                        pytrace=False)
        result = chain_result(raw, chain)
        assert result is not None, f"the probe did not report chain {chain!r}: {raw}"
        failure = chain_failure(result)
        pins = [line for flag, backend in grammar_backends(group.commands, chain)
                for line in pin_problems(flag, backend, packages_of(gpu, group))]  # fmt: skip
        assert not pins, explain(
            "\n".join(f"services {group.label}: {line}" for line in pins),
            failure.evidence() if failure else f"`{' '.join(result['modules'])}` imports with "
            f"{gpu.host.profile.python}", values=_values(gpu))
        assert failure is None, explain(
            f"services {group.label}: `{' '.join(result['modules'])}` does not import with "
            f"{gpu.host.profile.python} ({failure.error}); fix package {failure.package}",
            failure.evidence(), values=_values(gpu))
    if not ran:
        skips.not_applicable(f"no service of {gpu.host.name} runs an entry point that imports chain "
                             f"{chain!r}")


def serving_chains_import(gpu: GpuHost) -> None:
    """Every import chain the services need imports: `import_chain` for each of them, all failures in one."""
    __tracebackhide__ = True
    names = dict.fromkeys(c.name for group in probe_groups(gpu) for c in gpu.chains(group))
    failures = []
    for name in names:
        try:
            import_chain(gpu, name)
        except AssertionError as exc:  # collect: smoke names every broken chain at once
            failures.append(str(exc))
    assert not failures, "\n\n".join(failures)


def installed_versions_satisfy_requirements(gpu: GpuHost) -> None:
    """Requires-Dist pins of sglang, sglang-kernel, flashinfer, torch, xgrammar hold for the serving stack."""
    __tracebackhide__ = True
    for group in probe_groups(gpu):
        packages = packages_of(gpu, group)
        present = [r for r in REQUIRERS if r in packages.get("requires", {})]
        issues = requirement_issues(packages, present)
        kernel = kernel_torch_issue(installed_versions(packages),
                                    packages.get("requires", {}).get("sglang-kernel"))
        issues += [kernel] if kernel else []
        serving = [i.describe() for i in issues if i.serving and i.installed is not None]
        serving_missing = [i.describe() for i in issues if i.serving and i.installed is None]
        other = [i.describe() for i in issues if not i.serving]
        if other:
            warnings.warn(EnvWarning(f"{gpu.host.name}: {len(other)} requirements outside the serving stack "
                                     f"are not met: {'; '.join(other[:20])}"), stacklevel=2)
        assert not serving, explain("installed serving-stack versions violate their dependents' pins "
                                    f"({group.label})",
                                    "\n".join(serving + serving_missing), values=_values(gpu))
        if serving_missing:
            warnings.warn(EnvWarning(f"{gpu.host.name}: serving-stack requirements not installed (the "
                                     "import chain decides whether they matter): "
                                     f"{'; '.join(serving_missing)}"),
                          stacklevel=2)


def service_flags_exist_in_installed_sglang(gpu: GpuHost) -> None:
    """Every SGLang service's command uses only flags the installed sglang still has: a flag a release removed
    (renamed) fails here, naming its replacement, before the server starts; one that the installed release
    still accepts but a later one removed is a warning."""
    __tracebackhide__ = True
    judged = []
    for group in probe_groups(gpu):
        commands = [v for v in gpu.views if v.name in group.services and runs_sglang(v.argv)]
        if not commands:
            continue
        installed = installed_versions(packages_of(gpu, group)).get("sglang")
        if installed is None:
            continue  # the import chain names a missing sglang
        judged.append(f"{group.label}: sglang {installed}")
        if newer_than_read(installed):
            warnings.warn(EnvWarning(f"{gpu.host.name}: sglang {installed} is newer than the releases whose "
                                     f"flags were read (up to {NEWEST_READ}): flags it removed are not known "
                                     "here (docs/sglang-versions.md, 'Adding a release')"), stacklevel=2)
        findings = [f for view in commands for f in flag_findings(view.name, view.argv, installed)]
        later = [f.describe() for f in findings if not f.gone]
        if later:
            warnings.warn(EnvWarning(f"{gpu.host.name}: {'; '.join(later)}"), stacklevel=2)
        gone = [f for f in findings if f.gone]
        assert not gone, explain(
            f"services {group.label} pass flags sglang {installed} no longer has: it would exit at once with "
            f"'error: unrecognized arguments: {' '.join(dict.fromkeys(f.removed.flag for f in gone))}'",
            "\n".join(f.describe() for f in gone), diagnosis="sglang-flag-removed")
    if not judged:
        skips.not_applicable(f"no service of {gpu.host.name} runs sglang with a command to read (or "
                             "sglang is not installed)")
    gpu.export("sglang_flags_checked", f"{'; '.join(judged)} (removed flags known up to sglang "
                                       f"{NEWEST_READ})")


def pip_check_clean_for_serving_stack(gpu: GpuHost) -> None:
    """`pip check` reports no version conflict that involves a serving-stack package."""
    __tracebackhide__ = True
    for group in probe_groups(gpu):
        packages = packages_of(gpu, group)
        check = packages.get("pip_check") or {}
        if not check.get("ran"):
            skips.could_not_check(f"pip is not available in {gpu.host.profile.python}: {check.get('stderr')}")
        issues, notes = pip_conflicts(packages)
        if notes:
            warnings.warn(EnvWarning(f"{gpu.host.name}: pip check: {'; '.join(notes[:20])}"), stacklevel=2)
        assert not issues, explain("pip check reports conflicts in the serving stack",
                                   "\n".join(i.text for i in issues))


def flashinfer_companions_match(gpu: GpuHost) -> None:
    """flashinfer-cubin and flashinfer-jit-cache, when installed, match flashinfer-python's version."""
    __tracebackhide__ = True
    for group in groups_with_flashinfer(gpu):
        problems = companion_mismatches(installed_versions(packages_of(gpu, group)))
        assert not problems, explain("FlashInfer refuses to load mismatched companion packages",
                                     "\n".join(problems))


def flashinfer_toolkit_supports_gpu_arch(gpu: GpuHost) -> None:
    """The CUDA toolkit FlashInfer's JIT resolves (CUDA_HOME, `which nvcc`, /usr/local/cuda) can target
    every GPU.

    FlashInfer <= 0.7.0 needs nvcc >= 12.9 for any SM 12.x GPU and otherwise drops the GPU and fails
    with the misleading "FlashInfer requires GPUs with sm75 or higher" (seed 000/004).
    """
    __tracebackhide__ = True
    for group in groups_with_flashinfer(gpu):
        report = gpu.toolkit(group)
        raw = gpu.cuda_toolkit(group)
        gpu.export("jit_toolkit", report.summary())
        evidence = (f"{report.summary()}\nnvcc --version: {(raw.get('nvcc') or {}).get('text', '')}\n"
                    f"other toolkits: {', '.join(report.other_toolkits) or 'none'}")
        assert report.home, explain(f"FlashInfer finds no CUDA toolkit: {raw['resolution'].get('error')}",
                                    evidence)
        assert report.nvcc, explain(f"FlashInfer's JIT needs {report.home}/bin/nvcc, which does not run",
                                    evidence)
        rejected = [t for t in report.targets if t.error]
        then = ("; FlashInfer then raises 'FlashInfer requires GPUs with sm75 or higher'"
                if not report.eligible else "")
        assert not rejected, explain(
            "; ".join(f"GPU {t.capability[0]}.{t.capability[1]}: {t.error} (nvcc {report.release} from "
                      f"{report.source} {report.home})" for t in rejected) + then,
            evidence,
            diagnosis="flashinfer-sm12x-nvcc" if any(t.capability[0] == 12 for t in rejected) else None)
        configured = gpu.host.profile.cuda_home
        if configured and os.path.normpath(configured) != os.path.normpath(report.home):
            pytest.fail(explain(f"the profile says host.cuda_home = {configured}, but the service's "
                                f"FlashInfer resolves {report.home} (from {report.source})", evidence),
                        pytrace=False)


def toolkit_has_curand_headers(gpu: GpuHost) -> None:
    """curand.h / curand_kernel.h are on the JIT's include path (sampling and norm kernels include them)."""
    __tracebackhide__ = True
    for group in groups_with_flashinfer(gpu):
        report = gpu.toolkit(group)
        missing = [h for h in ("curand.h", "curand_kernel.h", "cuda_runtime.h") if not report.headers.get(h)]
        dirs = gpu.cuda_toolkit(group).get("include_dirs", [])
        assert not missing, explain(f"{', '.join(missing)} not found for the JIT of {report.home}",
                                    "searched: " + "\n  ".join(dirs), diagnosis="curand-header-missing"
                                    if any(h.startswith("curand") for h in missing) else None)


def jit_link_finds_cuda_libraries(gpu: GpuHost) -> None:
    """The JIT link (`-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda`) finds both libraries."""
    __tracebackhide__ = True
    for group in groups_with_flashinfer(gpu):
        report = gpu.toolkit(group)
        missing = [f"lib{lib}.so" for lib in ("cudart", "cuda") if not report.libraries.get(lib)]
        dirs = gpu.cuda_toolkit(group).get("library_dirs", [])
        assert not missing, explain(f"{', '.join(missing)} not on the JIT's link path for CUDA home "
                                    f"{report.home}",
                                    "searched: " + "\n  ".join(dirs), diagnosis="cannot-find-libcuda")


def ninja_on_service_path(gpu: GpuHost) -> None:
    """FlashInfer's JIT runs `ninja` from PATH; the service's PATH must have it."""
    __tracebackhide__ = True
    for group in groups_with_flashinfer(gpu):
        raw = gpu.cuda_toolkit(group)
        assert raw.get("ninja"), explain("ninja is not on the service's PATH: every FlashInfer JIT build "
                                         "fails (install ninja system-wide or add the venv's bin/ to PATH)",
                                         f"PATH={raw['env'].get('PATH')}")


def sgl_kernel_has_build_for_gpu_arch(gpu: GpuHost) -> None:
    """sglang-kernel ships the common_ops build this GPU loads (sm90 on compute 9.0, sm100 otherwise)."""
    __tracebackhide__ = True
    for group in probe_groups(gpu):
        builds = gpu.sgl_kernel_builds(group)
        if not builds.get("found"):
            skips.not_applicable(f"sgl_kernel is not installed for {gpu.host.profile.python}")
        problems = sgl_kernel_problems(builds, gpu.capabilities(group))
        assert not problems, explain("sgl_kernel has no build for this GPU", "\n".join(problems))


def serving_stack_matches_baseline(gpu: GpuHost, request: pytest.FixtureRequest) -> None:
    """With --env-baseline: the serving stack and the driver equal the known-good snapshot.

    Always records this host's snapshot (a report property of `request`'s test, for --save-env-snapshot).
    """
    __tracebackhide__ = True
    group = probe_groups(gpu)[0]
    packages = packages_of(gpu, group)
    torch = gpu.torch_facts(group).get("torch") or {}
    driver = gpu.inventory.driver if gpu.has_gpu else None
    current = snapshot(packages, driver=driver, torch_cuda=torch.get("cuda"))
    request.node.user_properties.append((SNAPSHOT_PROPERTY, {"host": gpu.host.name, "snapshot": current}))
    gpu.export("serving_stack",
               {name: version for name, version in current["packages"].items() if is_serving(name)})
    baseline_path = gpu.options.baseline
    if baseline_path is None:
        skips.not_applicable("no --env-baseline given (this host's snapshot is recorded for "
                             "--save-env-snapshot)")
    try:
        baseline = read_baseline(baseline_path, gpu.host.name)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    drifts = diff(baseline, current)
    serving = [d.describe() for d in drifts if d.serving]
    other = [d.describe() for d in drifts if not d.serving]
    if other:
        warnings.warn(EnvWarning(f"{gpu.host.name}: {len(other)} other packages differ from {baseline_path}: "
                                 f"{'; '.join(other[:20])}"), stacklevel=2)
    assert not serving, explain(f"the serving stack differs from the baseline {baseline_path}",
                                "\n".join(serving))
