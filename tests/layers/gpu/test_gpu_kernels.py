"""The kernels layer's checks (pytest_dflash.layers.gpu.kernels): on builds recorded on the H200 and this CPU
machine, and for real in attach mode, where nothing is built or launched unless --allow-gpu-use says so."""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_data import H200, SUITES, load, ran_nothing, recorded, recorded_gpu

from pytest_dflash.errors import DflashError
from pytest_dflash.layers.gpu import kernels
from pytest_dflash.layers.gpu.hooks import KERNELS_PROPERTY, options_from_config
from pytest_dflash.layers.gpu.layer import GpuHost, GpuOptions, probe_source

CPU_INVENTORY = load("cpu-nvcc13/gpu_inventory.json")  # nvidia-smi not found on PATH
CHECKS = (lambda gpu, request: kernels.builds_cold(gpu, "sampling", request),
          lambda gpu, request: kernels.builds_cold(gpu, "decode", request),
          kernels.sampling_respects_top_k_top_p, kernels.decode_attention_matches_sdpa,
          kernels.triton_kernel_compiles_and_runs, kernels.service_does_not_rely_on_warm_jit_cache)


def _h200(tmp_path: Path, *, provision: bool = True, options: GpuOptions | None = None,
          **replaced: Any) -> tuple[GpuHost, dict[str, Any]]:
    probes = recorded("h200/layers", **replaced)
    return recorded_gpu(H200 / "profile.toml", probes, provision=provision, tmp_path=tmp_path, options=options), probes


def test_the_h200_builds_cold_and_computes_right(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    gpu, probes = _h200(tmp_path)
    sampling = kernels.builds_cold(gpu, "sampling", request)
    assert sampling.spec_name == "sampling" and sampling.flashinfer["version"] == "0.6.15.post1"
    kernels.builds_cold(gpu, "decode", request)
    kernels.sampling_respects_top_k_top_p(gpu, request)
    kernels.decode_attention_matches_sdpa(gpu, request)
    kernels.triton_kernel_compiles_and_runs(gpu, request)
    kernels.service_does_not_rely_on_warm_jit_cache(gpu, request)
    entries = {value["module"]: value for key, value in request.node.user_properties if key == KERNELS_PROPERTY}
    assert entries["sampling"]["outcome"] == "ok" and round(entries["sampling"]["build_s"]) == 87  # recorded
    assert set(gpu.host.facts.export["jit_builds"]) == {"sampling", "decode", "triton"}
    assert gpu.host.facts.export["warm_jit_cache"]["relied"] == []
    assert ran_nothing(gpu, probes)


def test_attach_mode_skips_every_check_naming_the_option(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    gpu, _ = _h200(tmp_path, provision=False)
    for check in CHECKS:
        with pytest.raises(pytest.skip.Exception, match="attach mode: .*pass --allow-gpu-use "
                                                        r"\(ini dflash_allow_gpu_use = true\)"):
            check(gpu, request)
    with pytest.raises(DflashError, match="--allow-gpu-use"):  # nor can a suite of one's own build anything
        gpu.kernels("sampling", gpu.groups[0])
    allowed, _ = _h200(tmp_path, provision=False, options=GpuOptions(allow_gpu_use=True))
    for check in CHECKS:
        check(allowed, request)


def test_seed_004_the_cold_build_fails_and_the_warm_cache_is_relied_on(tmp_path: Path,
                                                                       request: pytest.FixtureRequest) -> None:
    """NVCC_APPEND_FLAGS breaks nvcc while the service's warm cache holds a sampling module (recorded on the H200)."""
    probes = recorded("h200/broken")
    gpu = recorded_gpu(H200 / "profile-broken-nvcc.toml", probes, provision=True, tmp_path=tmp_path)
    with pytest.raises(AssertionError, match=r"\[nvcc-rejects-flags\]") as build:
        kernels.builds_cold(gpu, "sampling", request)
    assert "nvcc fatal   : Unknown option '--this-flag-does-not-exist'" in str(build.value)
    with pytest.raises(pytest.skip.Exception, match=r"the sampling module did not build \(see "
                                                    r"test_flashinfer_sampling_builds_cold\)"):
        kernels.sampling_respects_top_k_top_p(gpu, request)
    with pytest.raises(AssertionError, match=r"\[sampling-jit-first-sampled-request\]") as warm:
        kernels.service_does_not_rely_on_warm_jit_cache(gpu, request)
    assert "relies on its warm JIT cache for 0.6.15.post1/90a/sampling" in str(warm.value)
    assert ran_nothing(gpu, probes)


@pytest.mark.parametrize(("recording", "failure", "diagnosis"), [
    ("kernels_sampling_no_curand", "sampling.cuh:20:10: fatal error: curand.h: No such file or directory",
     "curand-header-missing"),
    ("kernels_sampling_cpath", "cannot find -lcudart", "cannot-find-libcuda"),
    ("kernels_sampling_sm70", "FlashInfer requires GPUs with sm75 or higher", "flashinfer-no-eligible-arch"),
])
def test_the_cpu_machines_compile_step_fails_for_its_real_reasons(tmp_path: Path, request: pytest.FixtureRequest,
                                                                  recording: str, failure: str,
                                                                  diagnosis: str) -> None:
    gpu, _ = _h200(tmp_path, gpu_inventory=CPU_INVENTORY, kernels_sampling=load(f"cpu-nvcc13/{recording}.json"))
    build = kernels.KernelBuild("sampling", gpu.cache["kernels_sampling"])
    assert build.failure is not None and failure in build.failure
    assert build.record("cpu")["outcome"].endswith("(compile only, 9.0)") or recording.endswith("sm70")
    with pytest.raises(AssertionError, match=rf"\[{diagnosis}\]") as failed:
        kernels.builds_cold(gpu, "sampling", request)
    assert failure in str(failed.value)
    with pytest.raises(pytest.skip.Exception, match="no GPU on h200: nvidia-smi not found on PATH: only the "
                                                    "compile step runs here"):
        kernels.sampling_respects_top_k_top_p(gpu, request)


def test_allow_gpu_use_comes_from_the_flag_or_the_ini_key(pytester: pytest.Pytester) -> None:
    assert options_from_config(pytester.parseconfig()).allow_gpu_use is False
    assert options_from_config(pytester.parseconfig("--allow-gpu-use")).allow_gpu_use is True
    pytester.makeini("[pytest]\ndflash_allow_gpu_use = true\n")
    assert options_from_config(pytester.parseconfig()).allow_gpu_use is True


# ---- for real: the kernels suite attached to this machine (no --provision) ---------------------------------


def _attach_profile(tmp_path: Path) -> Path:
    """This machine in attach mode; the service's arch list makes FlashInfer's own refusal the cheap real build."""
    lines = ["[host]", 'name = "attached"', 'connection = "local://"', f"python = {json.dumps(sys.executable)}",
             'provision = "allowed"', "", "[services.dflash]", 'kind = "process"', 'algorithm = "DFLASH"',
             'command = ["{python}", "-m", "sglang.launch_server", "--port", "{port}"]',
             'env = { FLASHINFER_CUDA_ARCH_LIST = "7.0" }']
    path = tmp_path / "attached.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _kernel_builds_sent(log: Path) -> list[str]:
    """The commands of the run's audit trail that sent the kernels probe (the one that builds and launches)."""
    source = probe_source("kernels")
    sent = []
    for line in log.read_text().splitlines() if log.exists() else []:
        command = str(json.loads(line)["command"])
        match = re.match(r"printf %s (?P<payload>[A-Za-z0-9+/=]+) \| base64 -d \|", command)
        if match and base64.b64decode(match["payload"]).decode() == source:
            sent.append(command)
    return sent


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
         *args: str) -> tuple[pytest.RunResult, list[str]]:
    log = tmp_path / "commands.jsonl"
    monkeypatch.setenv("DFLASH_COMMAND_LOG", str(log))  # the transport's audit trail of every command sent
    result = pytester.runpytest_subprocess(str(SUITES / "kernels"), "-p", "no:cacheprovider", "-rA",
                                           f"--dflash-report={tmp_path / 'r'}", "--host",
                                           str(_attach_profile(tmp_path)), *args)
    return result, _kernel_builds_sent(log)


def test_attached_kernels_skip_naming_the_option_and_send_no_build(pytester: pytest.Pytester, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    result, builds = _run(pytester, monkeypatch, tmp_path)
    assert result.ret == 0 and result.parseoutcomes() == {"skipped": 6}, result.stdout.str()
    result.stdout.fnmatch_lines(["SKIPPED [[]6[]] *: attach mode: the kernels layer would build and launch kernels "
                                 "on attached's GPUs next to its running services; pass --allow-gpu-use (ini "
                                 "dflash_allow_gpu_use = true) to allow it"])
    assert builds == []


def test_attached_kernels_run_with_allow_gpu_use(pytester: pytest.Pytester, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer-python is not installed in this venv: the kernels layer has nothing to build")
    result, builds = _run(pytester, monkeypatch, tmp_path, "--allow-gpu-use", "-k", "sampling_builds_cold")
    out = result.stdout.str()
    assert result.ret == 1 and result.parseoutcomes()["failed"] == 1, out
    result.stdout.fnmatch_lines(["*test_flashinfer_sampling_builds_cold*",
                                 "*[[]flashinfer-no-eligible-arch[]]*"])
    assert "FlashInfer requires GPUs with sm75 or higher" in out  # FlashInfer's own words: the build really ran
    assert len(builds) == 1
