"""The host layer's checks (pytest_dflash.layers.gpu.host) on the H200's and this CPU machine's recorded probes.

Each check runs on a real GpuHost whose probe cache holds the recorded outputs, so nothing runs here; a
recorded output is changed only where a test says so, to show the failure the change must cause.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from gpu_data import H200, load, ran_nothing, recorded, recorded_gpu

from pytest_dflash.layers.gpu import host
from pytest_dflash.layers.gpu.layer import GpuHost
from pytest_dflash.run import skips

CPU_INVENTORY = load("cpu-nvcc13/gpu_inventory.json")  # nvidia-smi not found on PATH


def _profile(tmp_path: Path, gpus: str | None) -> Path:
    """The H200's profile naming `gpus` for host and service (None: naming none); a service on several GPUs
    runs tensor-parallel over them (its `gpus` must agree with its --tp-size)."""
    line = "" if gpus is None else f"gpus = {gpus}\n"
    text = (H200 / "profile.toml").read_text().replace("gpus = [0]\n", line)
    if gpus is not None and gpus.count(",") > 0:
        text = text.replace('"--port", "{port}",', f'"--port", "{{port}}", "--tp-size", "{gpus.count(",") + 1}",')
    path = tmp_path / "h200.toml"
    path.write_text(text)
    return path


def _h200(tmp_path: Path, *, provision: bool = False, **replaced: Any) -> tuple[GpuHost, dict[str, Any]]:
    probes = recorded("h200/layers", **replaced)
    return recorded_gpu(H200 / "profile.toml", probes, provision=provision, tmp_path=tmp_path), probes


def test_the_h200_passes_every_host_check(tmp_path: Path) -> None:
    gpu, probes = _h200(tmp_path)
    host.nvidia_smi_lists_gpus(gpu)
    host.profile_gpus_present(gpu)
    host.gpus_visible(gpu)
    host.gpu_identity_reported(gpu)
    host.gpu_memory_healthy(gpu)
    host.kernel_log_has_no_gpu_faults(gpu)
    host.kernel_log_has_no_oom_kills(gpu)
    exported = gpu.host.facts.export["gpus"]
    assert exported["driver"] == "580.159.04" and exported["gpus"][0]["memory_total_mib"] == 143771
    assert ran_nothing(gpu, probes)


def test_foreign_processes_are_judged_only_when_provisioning(tmp_path: Path) -> None:
    attached, _ = _h200(tmp_path)
    with pytest.raises(pytest.skip.Exception, match="attach mode: the running services hold their own GPUs"):
        host.service_gpus_not_held_by_other_processes(attached)
    provisioning, _ = _h200(tmp_path, provision=True)
    host.service_gpus_not_held_by_other_processes(provisioning)  # the H200 was idle


def test_a_profile_naming_gpus_on_a_host_without_nvidia_smi_fails(tmp_path: Path) -> None:
    probes = recorded("h200/layers", gpu_inventory=CPU_INVENTORY)
    gpu = recorded_gpu(H200 / "profile.toml", probes, tmp_path=tmp_path)
    message = "the profile names GPUs [0] but nvidia-smi did not answer: nvidia-smi not found on PATH"
    for check in (host.nvidia_smi_lists_gpus, host.gpus_visible):  # smoke fails the same way
        with pytest.raises(AssertionError, match=message.replace("[", r"\[").replace("]", r"\]")):
            check(gpu)
    with pytest.raises(pytest.skip.Exception, match="no GPU on h200: nvidia-smi not found on PATH"):
        host.profile_gpus_present(gpu)


def test_a_host_without_gpus_whose_profile_names_none_skips(tmp_path: Path) -> None:
    probes = recorded("h200/layers", gpu_inventory=CPU_INVENTORY)
    gpu = recorded_gpu(_profile(tmp_path, None), probes, tmp_path=tmp_path)
    assert gpu.expected_gpus == ()
    for check in (host.nvidia_smi_lists_gpus, host.gpus_visible):
        with pytest.raises(pytest.skip.Exception, match=r"nvidia-smi not found on PATH \(and its profile names none\)"):
            check(gpu)


def test_a_gpu_index_the_host_lacks_fails_full_and_smoke(tmp_path: Path) -> None:
    probes = recorded("h200/layers")
    gpu = recorded_gpu(_profile(tmp_path, "[0, 1]"), probes, tmp_path=tmp_path)
    for check in (host.profile_gpus_present, host.gpus_visible):
        with pytest.raises(AssertionError, match=r"GPUs \[1\] named in .*h200.toml are not on the host "
                                                 r"\(nvidia-smi lists \[0\]\)"):
            check(gpu)


def test_a_pending_row_remap_fails_memory_health(tmp_path: Path) -> None:
    inventory = copy.deepcopy(load("h200/layers/gpu_inventory.json"))
    inventory["xml"]["stdout"] = inventory["xml"]["stdout"].replace("<remapped_row_pending>No",
                                                                    "<remapped_row_pending>Yes")
    gpu, _ = _h200(tmp_path, gpu_inventory=inventory)
    with pytest.raises(AssertionError, match="GPU memory is not healthy") as failed:
        host.gpu_memory_healthy(gpu)
    assert "a memory row remapping is pending (a GPU reset is needed)" in str(failed.value)


def test_xid_and_oom_lines_fail_the_kernel_log_checks(tmp_path: Path) -> None:
    log = dict(load("h200/layers/kernel_log.json"))
    log["matches"] = ["[ 812.1] NVRM: Xid (PCI:0000:41:00): 79, pid=3121, name=python, GPU has fallen off the bus.",
                      "[1000.0] Out of memory: Killed process 4242 (python3) total-vm:90000kB, anon-rss:8000kB"]
    gpu, _ = _h200(tmp_path, kernel_log=log)
    with pytest.raises(AssertionError, match=r"the kernel log reports GPU faults since boot \(Xid codes \[79\]\)"):
        host.kernel_log_has_no_gpu_faults(gpu)
    with pytest.raises(AssertionError, match="the kernel OOM killer fired host-wide since boot"):
        host.kernel_log_has_no_oom_kills(gpu)


def test_a_containers_own_memory_limit_is_a_note_not_a_host_failure(tmp_path: Path) -> None:
    log = dict(load("h200/layers/kernel_log.json"))
    log["matches"] = ["[14548.468848] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
                      "[14548.469286] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=libpod-e1ae,"
                      "mems_allowed=0,oom_memcg=/libpod_parent/libpod-e1ae,task=python,pid=2541,uid=0"]
    gpu, _ = _h200(tmp_path, kernel_log=log)
    host.kernel_log_has_no_oom_kills(gpu)
    assert any("memory-cgroup OOM kill" in note for note in gpu.host.notes), gpu.host.notes


def test_an_unreadable_kernel_log_skips_and_a_failed_probe_fails(tmp_path: Path) -> None:
    unreadable = {**load("h200/layers/kernel_log.json"), "readable": False}
    gpu, _ = _h200(tmp_path, kernel_log=unreadable)
    with pytest.raises(pytest.skip.Exception, match=r"the kernel log is not readable on h200 \(journalctl -k: rc None") \
            as skipped:
        host.kernel_log_has_no_gpu_faults(gpu)
    assert skips.kind(str(skipped.value.msg)) == skips.UNCHECKED  # a GPU host: its kernel log must be readable
    broken, _ = _h200(tmp_path, kernel_log={"probe": "kernel_log", "transport_error": "h200: no answer within 60s"})
    with pytest.raises(pytest.fail.Exception, match="the kernel-log probe could not run"):
        host.kernel_log_has_no_oom_kills(broken)


UNREACHABLE = """[host]
connection = "ssh://root@127.0.0.1:1?timeout=3"

[services.dflash]
unit = "sglang-dflash.service"
algorithm = "DFLASH"
port = 30001
"""


@pytest.mark.parametrize("check", [host.nvidia_smi_lists_gpus, host.profile_gpus_present,
                                   host.gpu_identity_reported, host.gpu_memory_healthy],
                         ids=lambda check: check.__name__)
def test_an_unreachable_host_could_not_be_checked_never_does_not_apply(tmp_path: Path, check: Any) -> None:
    """ssh to a port nothing listens on (a real connection refused): the GPU inventory probe never ran, so
    nothing says the host has no GPU. Each check is a "could not check" skip (never a pass: the host is partial
    at best, a gate fails) naming the host and ssh's error; before, it was skipped as "does not apply" (no GPU
    on gpu7), which let the host layer look innocent. The reachability check is the one failure."""
    profile = tmp_path / "gpu7.toml"
    profile.write_text(UNREACHABLE)
    gpu = recorded_gpu(profile, {}, tmp_path=tmp_path)
    with pytest.raises(pytest.skip.Exception) as failed:
        check(gpu)
    message = str(failed.value)
    assert skips.is_unchecked(message), message
    assert "gpu7 could not be reached: the GPU inventory probe did not run" in message, message
    assert "ssh failed" in message and "port 1" in message, message
