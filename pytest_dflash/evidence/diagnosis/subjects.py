"""What a failure names beside its cause: how its service is run (the `mode` that picks a remedy a reader can
follow) and, for a tensor-parallel service, the ranks that died or stopped, with their pid, GPU and the GPU's
bus id where the host layer's inventory knows it."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pytest_dflash.errors import RankFault
from pytest_dflash.services.ranks import rank_faults_in_log

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle
    from pytest_dflash.run.state import HostContext


def service_mode(host: HostContext, handles: Sequence[ServiceHandle]) -> str:
    """'attach' (reached by URL only: no host access, nothing started), 'container', 'provisioned' (started
    from the profile's command), or '' (a unit or process attached on a host the run can read)."""
    if not handles:
        return "" if host.has_host_access else "attach"
    handle = handles[0]
    if handle.spec.kind == "container":
        return "container"
    if handle.manager.provisioned:
        return "provisioned"
    return "" if host.has_host_access else "attach"


def bus_ids(probes: Mapping[str, Any]) -> dict[int, str]:
    """GPU index -> PCI bus id, from the host layer's gpu_inventory probe (nvidia-smi --query-gpu CSV); {}
    when it did not run or said nothing."""
    query = (probes.get("gpu_inventory") or {}).get("query") or {}
    text = query.get("stdout") if isinstance(query, Mapping) else None
    if not isinstance(text, str) or not text.strip():
        return {}
    out: dict[int, str] = {}
    rows = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(rows, [])]
    if "index" not in header or "pci.bus_id" not in header:
        return out
    index, bus = header.index("index"), header.index("pci.bus_id")
    for row in rows:
        if len(row) > max(index, bus) and row[index].strip().isdigit():
            out[int(row[index].strip())] = row[bus].strip()
    return out


def _with_bus(fault: RankFault, gpus: Sequence[int], buses: Mapping[int, str]) -> RankFault:
    """Only where the profile lists the service's GPUs is a rank's physical GPU (and so its bus) known."""
    if fault.bus_id or fault.rank >= len(gpus):
        return fault
    bus = buses.get(gpus[fault.rank], "")
    return replace(fault, bus_id=bus) if bus else fault


def rank_faults(host: HostContext, handle: ServiceHandle, *, errors: Iterable[BaseException],
                log: str) -> list[RankFault]:
    """The ranks of `handle` that died or stopped: as the errors of this failure name them (readiness, a stuck
    check, a death after the test), else as its log says (a rank SIGKILLed while serving, which a test sees
    only as a dropped connection). One per rank, the error's word first."""
    found: dict[int, RankFault] = {}
    for error in errors:
        for fault in getattr(error, "ranks", ()) or ():
            if isinstance(fault, RankFault):
                found.setdefault(fault.rank, fault)
    when = "serving" if handle.ready is not None else "readiness"
    for fault in rank_faults_in_log(log, handle.spec.gpus, when=when):
        found.setdefault(fault.rank, fault)
    buses = bus_ids(host.facts.gpu_probes) if found and handle.spec.gpus else {}
    return [_with_bus(found[rank], handle.spec.gpus, buses) for rank in sorted(found)]


def rank_subject(faults: Sequence[RankFault]) -> str:
    """'tensor-parallel rank TP1 (rank 1, pid 4242, visible GPU 1) died while serving: killed by SIGKILL'."""
    return "; ".join(fault.sentence() for fault in faults)
