"""The env layer's checks (pytest_dflash.layers.gpu.env) on probes recorded on the H200 and this CPU machine.

Each check runs on a real GpuHost whose probe cache holds the recorded outputs, so nothing runs here; a
recorded output is changed only where a test says so, to show the failure the change must cause.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from gpu_data import H200, load, ran_nothing, recorded, recorded_gpu

from pytest_dflash.layers.gpu import env
from pytest_dflash.layers.gpu.hooks import SNAPSHOT_PROPERTY
from pytest_dflash.layers.gpu.layer import GpuHost, GpuOptions

SGLANG_CHAINS = ("http_server", "grammar", "sgl_kernel", "flashinfer")


def _h200(tmp_path: Path, *, options: GpuOptions | None = None, **replaced: Any) -> tuple[GpuHost, dict[str, Any]]:
    probes = recorded("h200/layers", **replaced)
    return recorded_gpu(H200 / "profile.toml", probes, tmp_path=tmp_path, options=options), probes


@pytest.mark.filterwarnings("ignore::pytest_dflash.layers.gpu.env.EnvWarning")  # sglang's optional extras
def test_the_h200_passes_every_env_check(tmp_path: Path) -> None:
    gpu, probes = _h200(tmp_path)
    env.service_python_is_the_profiles(gpu)
    env.torch_imports(gpu)
    env.torch_initialises_cuda(gpu)
    env.torch_arch_list_covers_gpus(gpu)
    env.driver_supports_torch_cuda(gpu)
    for chain in SGLANG_CHAINS:
        env.import_chain(gpu, chain)
    env.serving_chains_import(gpu)
    env.installed_versions_satisfy_requirements(gpu)
    env.service_flags_exist_in_installed_sglang(gpu)
    env.pip_check_clean_for_serving_stack(gpu)
    env.flashinfer_companions_match(gpu)
    env.flashinfer_toolkit_supports_gpu_arch(gpu)
    env.toolkit_has_curand_headers(gpu)
    env.jit_link_finds_cuda_libraries(gpu)
    env.ninja_on_service_path(gpu)
    env.sgl_kernel_has_build_for_gpu_arch(gpu)
    exported = gpu.host.facts.export
    assert exported["torch"]["version"] == "2.11.0+cu130" and "CUDA home /usr/local/cuda" in exported["jit_toolkit"]
    assert exported["sglang_flags_checked"].startswith("dflash: sglang 0.5.17")
    assert ran_nothing(gpu, probes)


def test_chains_no_service_runs_are_skipped(tmp_path: Path) -> None:
    gpu, _ = _h200(tmp_path)
    with pytest.raises(pytest.skip.Exception, match="no service of h200 runs an entry point that imports chain "
                                                    "'refserver_http'"):
        env.import_chain(gpu, "refserver_http")
    assert set(env.ALL_CHAINS) >= {*SGLANG_CHAINS, "refserver_http"}


def test_the_non_serving_findings_of_the_h200_are_warnings(tmp_path: Path) -> None:
    gpu, _ = _h200(tmp_path)
    with pytest.warns(env.EnvWarning, match="requirements outside the serving stack are not met"):
        env.installed_versions_satisfy_requirements(gpu)
    with pytest.warns(env.EnvWarning, match="pip check: sglang 0.5.17 requires anthropic"):
        env.pip_check_clean_for_serving_stack(gpu)


def test_a_torch_without_kernels_for_the_gpu_fails(tmp_path: Path) -> None:
    torch = copy.deepcopy(load("h200/layers/torch_facts.json"))
    torch["torch"]["arch_list"] = ["sm_80", "compute_80"][:1]
    gpu, _ = _h200(tmp_path, torch_facts=torch)
    with pytest.raises(AssertionError, match=r"\[no-kernel-image\]") as failed:
        env.torch_arch_list_covers_gpus(gpu)
    assert "torch 2.11.0+cu130 has no kernels for this GPU" in str(failed.value)


def test_a_torch_that_does_not_import_fails_every_torch_check(tmp_path: Path) -> None:
    broken = {"probe": "torch_facts", "import_error": "ImportError: libcudnn.so.9: cannot open shared object file"}
    gpu, _ = _h200(tmp_path, torch_facts=broken)
    for check in (env.torch_imports, env.torch_initialises_cuda, env.torch_arch_list_covers_gpus):
        with pytest.raises(pytest.fail.Exception, match=r"torch does not import in /opt/torch/.venv/bin/python3 "
                                                        r"\(services dflash\)"):
            check(gpu)


@pytest.mark.filterwarnings("ignore::pytest_dflash.layers.gpu.env.EnvWarning")
def test_the_abi_split_fails_the_chain_and_the_pins(tmp_path: Path) -> None:
    """sglang-kernel 0.4.7 (a torch 2.13 build) over torch 2.11, as recorded on the H200."""
    probes = recorded("h200/faults")
    gpu = recorded_gpu(H200 / "profile-torch-abi-split.toml", probes, tmp_path=tmp_path)
    with pytest.raises(AssertionError, match=r"\[sgl-kernel-undefined-symbol\]") as chain:
        env.import_chain(gpu, "sgl_kernel")
    assert "fix package sglang-kernel" in str(chain.value)
    with pytest.raises(AssertionError, match=r"\[sgl-kernel-undefined-symbol\]") as smoke:
        env.serving_chains_import(gpu)  # smoke: the same check for every chain, all failures in one
    assert "fix package sglang-kernel" in str(smoke.value) and "No module named 'flashinfer'" in str(smoke.value)
    with pytest.raises(AssertionError, match="sglang-kernel requires torch==2.13.0: torch 2.11.0 is installed"):
        env.installed_versions_satisfy_requirements(gpu)
    assert ran_nothing(gpu, probes)


@pytest.mark.filterwarnings("ignore::pytest_dflash.layers.gpu.env.EnvWarning")
def test_a_kernel_without_a_torch_pin_is_judged_by_the_torch_sglang_pairs_it_with(tmp_path: Path) -> None:
    """sglang-kernel 0.4.6.post1 (sglang 0.5.18/0.5.19, torch 2.13; no Requires-Dist on torch) over the H200's 2.11."""
    packages = copy.deepcopy(load("h200/layers/packages.json"))
    packages["distributions"]["sglang-kernel"]["version"] = "0.4.6.post1"
    assert packages["requires"]["sglang-kernel"] == []  # as the 0.4.5 / 0.4.6.post1 wheels' METADATA
    gpu, _ = _h200(tmp_path, packages=packages)
    with pytest.raises(AssertionError, match="installed serving-stack versions violate") as failed:
        env.installed_versions_satisfy_requirements(gpu)
    assert ("sglang-kernel requires torch==2.13.* (built for the torch sglang 0.5.18 and 0.5.19 pin with it; its "
            "METADATA names no torch): torch 2.11.0 is installed") in str(failed.value)


@pytest.mark.parametrize("version", ["0.5.24", "0.6.0.dev1"])
def test_an_sglang_newer_than_the_releases_read_is_a_warning(tmp_path: Path, version: str) -> None:
    packages = copy.deepcopy(load("h200/layers/packages.json"))
    packages["distributions"]["sglang"]["version"] = version
    gpu, _ = _h200(tmp_path, packages=packages)
    with pytest.warns(env.EnvWarning, match=f"sglang {version} is newer than the releases whose flags were read "
                                            r"\(up to 0.5.23\)"):
        env.service_flags_exist_in_installed_sglang(gpu)


def test_the_cpu_machines_toolkit_lacks_curand_and_the_cuda_libraries(tmp_path: Path) -> None:
    # This machine's recordings hold the toolkit probe; the versions below are stated in tests/data/gpu/README.md.
    probes = recorded("cpu-nvcc13", packages={"distributions": {"flashinfer-python": {"version": "0.7.2.post1"}}},
                      torch_facts={"probe": "torch_facts", "torch": {"version": "2.13.0+cpu", "cuda": None}})
    gpu = recorded_gpu(H200 / "profile.toml", probes, tmp_path=tmp_path)
    with pytest.raises(AssertionError, match=r"\[curand-header-missing\]") as headers:
        env.toolkit_has_curand_headers(gpu)
    assert "curand.h, curand_kernel.h not found for the JIT of /usr/local" in str(headers.value)
    with pytest.raises(AssertionError, match=r"\[cannot-find-libcuda\]") as link:
        env.jit_link_finds_cuda_libraries(gpu)
    assert "libcudart.so, libcuda.so not on the JIT's link path for CUDA home /usr/local" in str(link.value)
    with pytest.raises(pytest.fail.Exception, match="the profile says host.cuda_home = /usr/local/cuda, but the "
                                                    r"service's FlashInfer resolves /usr/local \(from which nvcc\)"):
        env.flashinfer_toolkit_supports_gpu_arch(gpu)


def test_no_flashinfer_means_nothing_jit_compiles(tmp_path: Path) -> None:
    gpu, _ = _h200(tmp_path, packages={"distributions": {}})
    for check in (env.flashinfer_companions_match, env.toolkit_has_curand_headers, env.ninja_on_service_path):
        with pytest.raises(pytest.skip.Exception, match="flashinfer-python is not installed for "
                                                        "/opt/torch/.venv/bin/python3: nothing JIT-compiles"):
            check(gpu)


def test_the_baseline_records_the_snapshot_and_fails_on_serving_drift(tmp_path: Path,
                                                                      request: pytest.FixtureRequest) -> None:
    gpu, _ = _h200(tmp_path)
    with pytest.raises(pytest.skip.Exception, match="no --env-baseline given"):
        env.serving_stack_matches_baseline(gpu, request)
    (recorded_snapshot,) = [v for k, v in request.node.user_properties if k == SNAPSHOT_PROPERTY]
    assert recorded_snapshot["host"] == "h200" and recorded_snapshot["snapshot"]["packages"]["torch"] == "2.11.0"
    good = H200 / "layers" / "env-snapshot.json"
    same, _ = _h200(tmp_path, options=GpuOptions(baseline=good))
    env.serving_stack_matches_baseline(same, request)  # the snapshot the H200 run wrote
    drifted = json.loads(good.read_text())
    drifted["hosts"]["h200"]["packages"]["torch"] = "2.11.0+cu128"
    (tmp_path / "drifted.json").write_text(json.dumps(drifted))
    changed, _ = _h200(tmp_path, options=GpuOptions(baseline=tmp_path / "drifted.json"))
    with pytest.raises(AssertionError, match="the serving stack differs from the baseline") as failed:
        env.serving_stack_matches_baseline(changed, request)
    assert "torch: 2.11.0+cu128 -> 2.11.0" in str(failed.value)
