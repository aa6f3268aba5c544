"""The pure checks behind the host/env/kernels layers, fed with probe outputs recorded on real hosts."""

from __future__ import annotations

import copy

from gpu_data import load

from pytest_dflash.layers.gpu.checks import (
    DECODE_MAX_ABS_ERR,
    chain_failure,
    chain_result,
    classify_kernel_lines,
    companion_mismatches,
    decode_problems,
    gpu_health,
    sampling_problems,
    sgl_kernel_problems,
    split_oom_kills,
    toolkit_report,
    torch_coverage,
    triton_problems,
    warm_cache_reliance,
    xid_codes,
)
from pytest_dflash.layers.gpu.smi import inventory_from_probe

H200 = "h200/layers/"


# ---- host ----


def test_h200_is_healthy_and_its_kernel_log_clean() -> None:
    (gpu,) = inventory_from_probe(load(H200 + "gpu_inventory.json")).gpus
    assert gpu_health(gpu) == []
    log = load(H200 + "kernel_log.json")
    assert log["readable"] and log["source"] == "dmesg" and log["total_lines"] > 100  # no journalctl there
    assert classify_kernel_lines(log["matches"]) == {}


def test_kernel_lines_are_classified() -> None:
    lines = ["[ 812.1] NVRM: Xid (PCI:0000:41:00): 79, pid=3121, name=python, GPU has fallen off the bus.",
             "[ 900.0] NVRM: Xid (PCI:0000:01:00): 13, pid=7, Graphics SM Warp Exception",
             "[1000.0] Out of memory: Killed process 4242 (python3) total-vm:90000kB, anon-rss:8000kB",
             "[1000.1] python3 invoked oom-killer: gfp_mask=0x140cca, order=0",
             "[1200.0] usb 1-1: new high-speed USB device"]
    found = classify_kernel_lines(lines)
    assert found == {"gpu-fallen-off-bus": lines[:1], "gpu-xid": lines[1:2], "oom-killer": lines[2:4]}
    assert xid_codes(lines) == [("0000:41:00", 79), ("0000:01:00", 13)]


def test_pending_remap_is_unhealthy() -> None:
    probe = copy.deepcopy(load(H200 + "gpu_inventory.json"))
    probe["xml"]["stdout"] = probe["xml"]["stdout"].replace("<remapped_row_pending>No", "<remapped_row_pending>Yes")
    (gpu,) = inventory_from_probe(probe).gpus
    assert gpu_health(gpu) == [f"{gpu.label}: a memory row remapping is pending (a GPU reset is needed)"]


# ---- env ----


def test_torch_coverage_on_the_h200() -> None:
    torch = load(H200 + "torch_facts.json")["torch"]
    assert [c.ok for c in torch_coverage(torch["arch_list"], [(9, 0)])] == [True]


def test_every_serving_chain_imported_on_the_h200() -> None:
    probe = load(H200 + "import_chain.json")
    for name in ("http_server", "grammar", "sgl_kernel", "flashinfer"):
        result = chain_result(probe, name)
        assert result is not None and chain_failure(result) is None, name
        assert result["imported"][0]["file"].startswith("/tmp/site/")  # the service's PYTHONPATH, not the image


def test_undefined_symbol_names_sglang_kernel() -> None:
    result = chain_result(load("h200/faults/import_chain.json"), "sgl_kernel")
    assert result is not None
    failure = chain_failure(result)
    assert failure is not None and failure.package == "sglang-kernel"
    assert "common_ops.abi3.so: undefined symbol: _ZNR5torch7Library4_def" in failure.evidence()


def test_missing_module_names_its_package() -> None:
    probe = load("cpu-nvcc13/import_chain.json")
    grammar = chain_result(probe, "grammar")
    assert grammar is not None
    failure = chain_failure(grammar)
    assert failure is not None and failure.error == "ModuleNotFoundError: No module named 'sglang'"
    assert failure.package == "sglang"
    for name in ("flashinfer", "refserver_http"):
        result = chain_result(probe, name)
        assert result is not None and chain_failure(result) is None, name


def test_structural_tag_names_xgrammar() -> None:
    result = {"name": "grammar", "ok": False, "rc": 0, "failed": {
        "module": "sglang.srt.server_args", "type": "ImportError",
        "message": "cannot import name 'StructuralTag' from 'xgrammar' (/tmp/site_noxst/xgrammar/__init__.py)",
        "missing": None, "owners": ["sglang"], "traceback": ""}}
    failure = chain_failure(result)
    assert failure is not None and failure.package == "xgrammar"


def test_timed_out_and_dead_interpreters_are_failures() -> None:
    failure = chain_failure({"name": "x", "ok": False, "timed_out": True, "seconds": 300.0, "stderr": "..."})
    assert failure is not None and "timed out" in failure.error


def test_toolkit_on_the_h200_and_on_the_cpu_machine() -> None:
    h200 = toolkit_report(load(H200 + "cuda_toolkit.json"), torch_cuda="13.0", flashinfer_version="0.6.15.post1",
                          capabilities=[(9, 0)])
    assert (h200.home, h200.source, h200.release) == ("/usr/local/cuda", "CUDA_HOME", "13.0")
    assert h200.eligible and [t.cache_dir for t in h200.targets] == ["90a"]
    assert all(h200.headers.values()) and all(h200.libraries.values()) and h200.ninja
    cpu = toolkit_report(load("cpu-nvcc13/cuda_toolkit.json"), torch_cuda=None, flashinfer_version="0.7.2.post1",
                         capabilities=[(9, 0)])
    assert (cpu.home, cpu.source) == ("/usr/local", "which nvcc")  # the /usr/local/bin/nvcc wrapper
    assert cpu.headers["curand.h"] is None and cpu.libraries == {"cudart": None, "cuda": None}
    assert "/usr/local/cuda-13.0 (nvcc 13.0)" in cpu.other_toolkits


def test_an_sm120_gpu_with_the_h200s_nvcc_and_an_older_one() -> None:
    raw = copy.deepcopy(load(H200 + "cuda_toolkit.json"))
    ok = toolkit_report(raw, torch_cuda="13.0", flashinfer_version="0.6.15.post1", capabilities=[(12, 0)])
    assert ok.eligible and ok.targets[0].cache_dir == "120f"
    raw["nvcc"]["release"] = "12.8"
    bad = toolkit_report(raw, torch_cuda="13.0", flashinfer_version="0.6.15.post1", capabilities=[(12, 0)])
    assert not bad.eligible and bad.targets[0].error == "SM 12.x requires CUDA >= 12.9"
    raw["nvcc"].update(release=None, rc=None, exists=False)
    fallback = toolkit_report(raw, torch_cuda="13.0", flashinfer_version="0.6.15.post1", capabilities=[(12, 0)])
    assert fallback.release_from.startswith("torch.version.cuda") and fallback.nvcc is None


def test_sgl_kernel_builds() -> None:
    builds = load(H200 + "sgl_kernel_builds.json")
    assert sgl_kernel_problems(builds, [(9, 0)]) == []
    problems = sgl_kernel_problems(builds, [(12, 0)])  # the trimmed stage has no sm100 build
    assert len(problems) == 1 and "sgl_kernel/sm100/common_ops" in problems[0] and "sm90" in problems[0]


def test_flashinfer_companions() -> None:
    assert companion_mismatches({"flashinfer-python": "0.6.15.post1"}) == []
    assert companion_mismatches({"flashinfer-python": "0.6.15.post1", "flashinfer-cubin": "0.6.15.post1",
                                 "flashinfer-jit-cache": "0.6.15.post1+cu130"}) == []
    assert len(companion_mismatches({"flashinfer-python": "0.6.15.post1", "flashinfer-cubin": "0.7.2",
                                     "flashinfer-jit-cache": "0.7.2+cu130"})) == 2


# ---- kernels ----


def test_h200_sampling_decode_and_triton_pass() -> None:
    assert sampling_problems(load(H200 + "kernels_sampling.json")["result"]["run"]) == []
    decode = load(H200 + "kernels_decode.json")["result"]["run"]
    assert decode_problems(decode) == [] and decode["max_abs_err"] < DECODE_MAX_ABS_ERR / 10
    assert triton_problems(load(H200 + "kernels_triton.json")["result"]["run"]) == []


def test_sampling_check_fails_on_violations_skew_and_a_blind_reference() -> None:
    run = load(H200 + "kernels_sampling.json")["result"]["run"]
    assert len(sampling_problems({**run, "violations": 3, "violation_examples": [{"row": 0}]})) == 1
    assert "total variation 0.200" in sampling_problems({**run, "tvd": [0.2] * 8})[0]
    assert "proves nothing" in sampling_problems({**run, "control_violations": 0})[0]


def test_decode_check_fails_on_error_and_on_a_blind_control() -> None:
    run = load(H200 + "kernels_decode.json")["result"]["run"]
    assert decode_problems({**run, "max_abs_err": 0.05})
    assert decode_problems({**run, "control_max_abs_err": 1e-4})


def test_warm_cache_on_the_healthy_h200_holds_nothing() -> None:
    report = warm_cache_reliance(load(H200 + "jit_cache.json"), flashinfer_version="0.6.15.post1",
                                 arch_dirs={"90a"}, cold={"sampling": True})
    assert (report.relied, report.unverified, report.matching) == ([], [], [])


def test_seed_004_warm_cache_with_a_broken_toolchain() -> None:
    cache = load("h200/broken/jit_cache.json")
    cold = {"sampling": False, "single_decode_with_kv_cache_dtype_q_f16": False}
    report = warm_cache_reliance(cache, flashinfer_version="0.6.15.post1", arch_dirs={"90a"}, cold=cold)
    assert report.relied == ["0.6.15.post1/90a/sampling"]
    healthy = warm_cache_reliance(cache, flashinfer_version="0.6.15.post1", arch_dirs={"90a"},
                                  cold={"sampling": True})
    assert healthy.matching == ["0.6.15.post1/90a/sampling"] and healthy.relied == []
    other_version = warm_cache_reliance(cache, flashinfer_version="0.7.2.post1", arch_dirs={"90a"}, cold=cold)
    assert other_version.relied == []  # a cache of another FlashInfer version is not used at all


def test_cached_modules_not_built_here_are_unverified_or_suspect() -> None:
    cache = {"modules": [{"version": "v", "arch": "90a", "module": "norm", "library": True}]}
    assert warm_cache_reliance(cache, flashinfer_version="v", arch_dirs={"90a"},
                               cold={"sampling": True}).unverified == ["v/90a/norm"]
    suspect = warm_cache_reliance(cache, flashinfer_version="v", arch_dirs={"90a"}, cold={"sampling": False})
    assert suspect.relied == ["v/90a/norm (not built here, but the same toolchain failed)"]


def test_a_memory_cgroup_oom_kill_is_not_a_host_wide_one() -> None:
    """Lines as this machine's kernel (6.x) wrote them for a podman container over its --memory limit."""
    memcg = ["[14548.468848] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
             "[14548.469286] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=libpod-e1ae,mems_allowed=0,"
             "oom_memcg=/libpod_parent/libpod-e1ae,task_memcg=/libpod_parent/libpod-e1ae,task=python,pid=2541,uid=0"]
    host = ["[1000.0] Out of memory: Killed process 4242 (python3) total-vm:90000kB, anon-rss:8000kB",
            "[1000.0] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom"]
    assert split_oom_kills(memcg) == ([], memcg[1:])
    assert split_oom_kills(memcg + host) == (host, memcg[1:])
