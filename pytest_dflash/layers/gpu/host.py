"""Host layer checks: are the GPUs the profile names there, identified and healthy? Nothing is started.

Each function is one check of suites/host (smoke runs a subset of the same functions): it skips with the
reason when the check cannot apply to this host, and otherwise passes or raises AssertionError with the
evidence (`explain`). Evidence: `nvidia-smi --query-gpu ... --format=csv`, `nvidia-smi -q -x`, the
compute-apps list and the kernel log since boot (Xid, "fallen off the bus", OOM killer), all read-only.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest

from pytest_dflash.errors import GpuFault
from pytest_dflash.layers.gpu.checks import classify_kernel_lines, gpu_health, split_oom_kills, xid_codes
from pytest_dflash.layers.gpu.layer import GpuHost
from pytest_dflash.layers.gpu.report import explain
from pytest_dflash.run import skips


class GpuHostWarning(UserWarning):
    """Something on a GPU host worth knowing that does not fail it."""


def require_host_access(gpu: GpuHost) -> None:
    """Skip on a host attached by URL: there is nothing to run commands on."""
    if not gpu.host.has_host_access:
        skips.not_applicable("attached by URL: no host access")


def require_gpus(gpu: GpuHost) -> None:
    """Skip without host access or without a GPU (with nvidia-smi's reason)."""
    require_host_access(gpu)
    if not gpu.has_gpu:
        skips.not_applicable(gpu.no_gpu_reason())


def nvidia_smi_lists_gpus(gpu: GpuHost) -> None:
    """nvidia-smi answers and lists GPUs; a host whose profile names GPUs must have them."""
    __tracebackhide__ = True
    require_host_access(gpu)
    inventory = gpu.inventory
    if not inventory.gpus and not gpu.expected_gpus:
        skips.not_applicable(gpu.no_gpu_reason() + " (and its profile names none)")
    raw = gpu.probe("gpu_inventory")
    evidence = "\n".join(str((raw.get(k) or {}).get("stderr") or "") for k in ("query", "xml")) or str(raw)
    assert inventory.available, explain(
        f"the profile names GPUs {list(gpu.expected_gpus)} but nvidia-smi did not answer: {inventory.reason}",
        evidence)
    assert inventory.gpus, explain("nvidia-smi answered but lists no GPU", str(raw.get("query")))


def profile_gpus_present(gpu: GpuHost) -> None:
    """Every GPU index named in the profile (host.gpus, services.*.gpus) exists on the host."""
    __tracebackhide__ = True
    require_gpus(gpu)
    if not gpu.expected_gpus:
        skips.not_applicable("the profile names no GPU indices")
    present = [g.index for g in gpu.inventory.gpus]
    missing = [index for index in gpu.expected_gpus if index not in present]
    if missing:  # the services on the GPUs that are there go on; those on a missing one are blocked
        raise GpuFault(explain(f"GPUs {missing} named in {gpu.host.profile.source} are not on the host "
                               f"(nvidia-smi lists {present})",
                               "\n".join(g.label for g in gpu.inventory.gpus)),
                       tuple(missing), tuple(f"GPU {index} (not on the host)" for index in missing))


def gpus_visible(gpu: GpuHost) -> None:
    """nvidia-smi lists GPUs and every one the profile names (smoke: the two checks above as one)."""
    __tracebackhide__ = True
    nvidia_smi_lists_gpus(gpu)
    if gpu.expected_gpus:  # a GPU host whose profile names no index has nothing more to check
        profile_gpus_present(gpu)


def gpu_identity_reported(gpu: GpuHost) -> None:
    """Name, compute capability, driver and memory are known for every GPU (recorded in the verdict)."""
    __tracebackhide__ = True
    require_gpus(gpu)
    inventory = gpu.inventory
    gpu.export("gpus", {
        "driver": inventory.driver, "driver_cuda": inventory.driver_cuda,
        "gpus": [dataclasses.asdict(g) for g in inventory.gpus],  # processes on each GPU included
    })
    record_gpu_matrix(gpu)
    incomplete = [g.label for g in inventory.gpus
                  if not g.name or g.capability is None or not g.driver or not g.memory_total_mib]
    assert not incomplete, explain(f"nvidia-smi does not report name / compute_cap / driver / memory for "
                                   f"{incomplete} (compute_cap needs driver >= 510)",
                                   str(gpu.probe("gpu_inventory").get("query")))
    off = [g.label for g in inventory.gpus if g.persistence is False]
    if off:
        warnings.warn(GpuHostWarning(f"{gpu.host.name}: persistence mode is off on {off}: the first CUDA "
                                     "call after idle re-initialises the driver (nvidia-smi -pm 1)"),
                      stacklevel=2)


def _fail_gpus(gpu: GpuHost, bad: dict[int, list[str]], summary: str, *,
               diagnosis: str | None = None) -> None:
    """Fail the check for the GPUs in `bad` (index -> evidence lines) only: errors.GpuFault blocks the
    services on them and no other (run/blocking.py). Each GPU is named by index, bus id, UUID, services."""
    __tracebackhide__ = True
    if not bad:
        return
    labels = tuple(gpu_label(gpu, index) for index in sorted(bad))
    users = gpu_users(gpu)
    named = "; ".join(f"{label}: services {', '.join(users.get(index, [])) or 'none'}"
                      for index, label in zip(sorted(bad), labels, strict=True))
    record_bad_gpus(gpu, bad, summary)
    raise GpuFault(explain(f"{summary} on {named}", "\n".join(line for i in sorted(bad) for line in bad[i]),
                           diagnosis=diagnosis), tuple(sorted(bad)), labels)


def gpu_label(gpu: GpuHost, index: int) -> str:
    """'GPU 4 (bus 0000:41:00.0, GPU-1b2c…)': what an operator finds the board by."""
    found = gpu.inventory.by_index(index) if gpu.inventory.available else None
    if found is None:
        return f"GPU {index}"
    return f"GPU {index} (bus {found.bus_id}, {found.uuid})"


def gpu_users(gpu: GpuHost) -> dict[int, list[str]]:
    """GPU index -> the services whose profile gives them that GPU."""
    out: dict[int, list[str]] = {}
    for name, spec in gpu.host.profile.services.items():
        for index in spec.gpus:
            out.setdefault(index, []).append(name)
    return out


def record_gpu_matrix(gpu: GpuHost) -> None:
    """The GPU x service matrix of the verdict (facts.export["gpu_matrix"]): every GPU nvidia-smi lists, by
    index: its label, the services the profile puts on it, and what the host layer found wrong (none yet)."""
    matrix = gpu.host.facts.export.setdefault("gpu_matrix", {})
    users = gpu_users(gpu)
    for found in gpu.inventory.gpus:
        matrix.setdefault(str(found.index), {"gpu": gpu_label(gpu, found.index),
                                             "services": users.get(found.index, []), "problems": []})


def record_bad_gpus(gpu: GpuHost, bad: dict[int, list[str]], summary: str) -> None:
    """Each bad GPU's finding, in the verdict's GPU x service matrix (`record_gpu_matrix`)."""
    matrix = gpu.host.facts.export.setdefault("gpu_matrix", {})
    for index, lines in bad.items():
        entry = matrix.setdefault(str(index), {"gpu": gpu_label(gpu, index),
                                               "services": gpu_users(gpu).get(index, []), "problems": []})
        entry["problems"].append(f"{summary}: {'; '.join(lines)[:500]}")


def gpu_memory_healthy(gpu: GpuHost) -> None:
    """No uncorrectable ECC errors, no pages pending retirement, no pending or failed row remapping; a bad GPU
    blocks only the services on it."""
    __tracebackhide__ = True
    require_gpus(gpu)
    bad = {g.index: problems for g in gpu.inventory.gpus if (problems := gpu_health(g))}
    _fail_gpus(gpu, bad, "GPU memory is not healthy")


def service_gpus_not_held_by_other_processes(gpu: GpuHost) -> None:
    """Before provisioning starts services, no other process holds memory on their GPUs."""
    __tracebackhide__ = True
    require_gpus(gpu)
    if not gpu.host.provisioning:
        skips.not_applicable("attach mode: the running services hold their own GPUs")
    wanted = {i for spec in gpu.host.profile.services.values() for i in spec.gpus}
    busy: dict[int, list[str]] = {}
    for g in gpu.inventory.gpus:
        if not wanted or g.index in wanted:
            for p in g.processes:
                held = f"{g.label}: pid {p.pid} {p.name} ({p.used_mib or '?'} MiB)"
                busy.setdefault(g.index, []).append(held)
    _fail_gpus(gpu, busy, "other processes hold memory on the services' GPUs before they start")


def kernel_log_lines(gpu: GpuHost) -> list[str]:
    """The kernel-log lines since boot that match the GPU / OOM patterns; skips when the log is unreadable."""
    require_host_access(gpu)
    log = gpu.kernel_log()
    if "transport_error" in log:
        pytest.fail(explain("the kernel-log probe could not run", log["transport_error"]), pytrace=False)
    if not log.get("readable"):
        tried = "; ".join(f"{' '.join(a['argv'][:2])}: rc {a['rc']} {a['stderr'][:200]}"
                          for a in log["attempts"])
        reason = f"the kernel log is not readable on {gpu.host.name} ({tried})"
        if gpu.has_gpu or gpu.expected_gpus:  # a GPU host must be checkable; a CPU test host need not
            skips.could_not_check(reason)
        skips.not_applicable(reason + ": a host without GPUs")
    lines: list[str] = log.get("matches", [])
    return lines


def kernel_log_has_no_gpu_faults(gpu: GpuHost) -> None:
    """No Xid errors and no GPU "fallen off the bus" since boot."""
    __tracebackhide__ = True
    found = classify_kernel_lines(kernel_log_lines(gpu))
    faults = found.get("gpu-fallen-off-bus", []) + found.get("gpu-xid", [])
    codes = sorted({code for _, code in xid_codes(faults)})
    summary = f"the kernel log reports GPU faults since boot (Xid codes {codes})"
    by_gpu = faults_by_gpu(gpu, faults)
    if faults and by_gpu is not None:
        _fail_gpus(gpu, by_gpu, summary)
    assert not faults, explain(summary, "\n".join(faults))


def faults_by_gpu(gpu: GpuHost, lines: list[str]) -> dict[int, list[str]] | None:
    """Kernel-log fault lines by the GPU whose PCI address they name (nvidia-smi's bus ids); None when one
    cannot be placed (no inventory, no address): then the whole host fails."""
    if not lines or not gpu.inventory.available:
        return None
    by_bus = {_pci(g.bus_id): g.index for g in gpu.inventory.gpus}
    out: dict[int, list[str]] = {}
    for line in lines:
        match = _PCI.search(line)
        index = by_bus.get(_pci(match.group(1))) if match else None
        if index is None:
            return None
        out.setdefault(index, []).append(line)
    return out


_PCI = re.compile(r"(?:PCI:|GPU at PCI:|GPU )((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)")


def _pci(address: str) -> str:
    """'0000:41:00', '00000000:41:00.0' and '41:00.0' as one key: bus:device."""
    parts = address.lower().split(".")[0].split(":")
    return ":".join(parts[-2:])


def kernel_log_has_no_oom_kills(gpu: GpuHost) -> None:
    """The kernel OOM killer has not killed anything host-wide since boot. Kills inside a memory cgroup (a
    container's or unit's own limit) are noted in the verdict, not failed: the host did not run out of
    memory."""
    __tracebackhide__ = True
    lines = classify_kernel_lines(kernel_log_lines(gpu)).get("oom-killer", [])
    host_wide, memcg = split_oom_kills(lines)
    if memcg:
        gpu.host.notes.append(f"{len(memcg)} memory-cgroup OOM kill line(s) since boot (a container's or "
                              f"unit's own limit, not the host's memory): {memcg[-1][:300]}")
    if host_wide or (lines and not memcg):
        kills = host_wide or lines
        raise AssertionError(explain("the kernel OOM killer fired host-wide since boot", "\n".join(kills)))
