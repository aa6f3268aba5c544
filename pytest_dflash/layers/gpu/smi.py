"""nvidia-smi output -> typed GPU facts (`--query-gpu ... --format=csv` and `-q -x`).

The CSV gives the fields every driver since 510 answers in one line per GPU; the XML adds what the
CSV cannot express in all driver generations (ECC counters, retired pages, remapped rows,
processes). Both are joined on the PCI bus id. "N/A", "[N/A]" and "[Not Supported]" become None.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_dflash.layers.gpu.arch import parse_capability

_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "none"}


class SmiParseError(ValueError):
    """nvidia-smi printed something this parser does not understand."""


def _value(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return None if text.lower() in _MISSING else text


def _mib(text: str | None) -> float | None:
    value = _value(text)
    if value is None:
        return None
    match = re.fullmatch(r"([\d.]+)\s*(MiB|GiB|KiB)?", value)
    if not match:
        raise SmiParseError(f"not a memory size: {text!r}")
    number = float(match.group(1))
    return number * {"GiB": 1024.0, "KiB": 1 / 1024}.get(match.group(2) or "MiB", 1.0)


def _int(text: str | None) -> int | None:
    value = _value(text)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise SmiParseError(f"not an integer: {text!r}") from None


def _yes(text: str | None) -> bool | None:
    value = _value(text)
    if value is None:
        return None
    return value.lower() in ("yes", "true", "enabled", "1")


def _bus(text: str) -> str:
    """Normalise PCI bus ids: '00000000:00:06.0' and '0000:00:06.0' are the same device."""
    text = text.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def parse_query_csv(text: str) -> list[dict[str, str]]:
    """`--format=csv` with its header -> one dict per GPU, keys without units ('memory.total')."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return []
    header = [re.sub(r"\s*\[[^\]]*\]$", "", name.strip()) for name in rows[0]]
    out = []
    for row in rows[1:]:
        if not row:
            continue
        if len(row) != len(header):
            raise SmiParseError(f"nvidia-smi CSV row has {len(row)} fields, header has "
                                f"{len(header)}: {row!r}")
        out.append(dict(zip(header, (cell.strip() for cell in row), strict=True)))
    return out


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: float | None
    gpu: str  # uuid or bus id


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    bus_id: str
    capability: tuple[int, int] | None
    driver: str | None
    memory_total_mib: float | None
    memory_used_mib: float | None
    persistence: bool | None
    ecc_enabled: bool | None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_pending: bool | None = None
    retired_pages: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def label(self) -> str:
        cap = f"{self.capability[0]}.{self.capability[1]}" if self.capability else "?"
        return f"GPU {self.index} ({self.name}, compute {cap}, {self.bus_id})"


@dataclass(frozen=True)
class XmlGpu:
    bus_id: str
    persistence: bool | None
    ecc_enabled: bool | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    retired_pending: bool | None
    retired_pages: int | None
    remap_pending: bool | None
    remap_failure: bool | None
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True)
class XmlFacts:
    driver: str | None
    cuda: str | None  # the newest CUDA the driver supports
    gpus: Mapping[str, XmlGpu] = field(default_factory=dict)  # by normalised bus id


def _uncorrected(node: ET.Element | None) -> int | None:
    """Sum of uncorrectable ECC counters under <volatile> / <aggregate>, across driver generations."""
    if node is None:
        return None
    # Hopper+: sram_uncorrectable_*, dram_uncorrectable leaves; older drivers: double_bit/total.
    numbers = [_int(c.text) for c in node.iter() if len(c) == 0 and "uncorrectable" in c.tag.lower()]
    numbers += [_int(db.findtext("total")) for db in node.iter("double_bit")]
    known = [n for n in numbers if n is not None]
    return sum(known) if known else None


def parse_xml(text: str) -> XmlFacts:
    """`nvidia-smi -q -x` -> driver facts and per-GPU health counters."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise SmiParseError(f"nvidia-smi -q -x is not XML: {exc}") from None
    gpus: dict[str, XmlGpu] = {}
    for node in root.findall("gpu"):
        bus = _bus(node.get("id") or node.findtext("pci/pci_bus_id") or "")
        ecc = node.find("ecc_errors")
        retired = node.find("retired_pages")
        retired_count = None
        if retired is not None:
            counts = [_int(e.text) for e in retired.iter("retired_count")]
            known = [c for c in counts if c is not None]
            retired_count = sum(known) if known else None
        processes = []
        for proc in node.findall("processes/process_info"):
            pid = _int(proc.findtext("pid"))
            if pid is None:
                continue
            processes.append(GpuProcess(pid, (proc.findtext("process_name") or "").strip(),
                                        _mib(proc.findtext("used_memory")), bus))
        gpus[bus] = XmlGpu(
            bus_id=bus,
            persistence=_yes(node.findtext("persistence_mode")),
            ecc_enabled=_yes(node.findtext("ecc_mode/current_ecc")),
            ecc_uncorrected_volatile=_uncorrected(ecc.find("volatile") if ecc is not None else None),
            ecc_uncorrected_aggregate=_uncorrected(ecc.find("aggregate") if ecc is not None else None),
            retired_pending=_yes(retired.findtext("pending_retirement")) if retired is not None else None,
            retired_pages=retired_count,
            remap_pending=_yes(node.findtext("remapped_rows/remapped_row_pending")),
            remap_failure=_yes(node.findtext("remapped_rows/remapped_row_failure")),
            processes=tuple(processes),
        )
    return XmlFacts(_value(root.findtext("driver_version")), _value(root.findtext("cuda_version")), gpus)


def parse_apps_csv(text: str) -> list[GpuProcess]:
    """`--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv`."""
    out = []
    for row in parse_query_csv(text):
        pid = _int(row.get("pid"))
        if pid is None:
            continue
        out.append(GpuProcess(pid, row.get("process_name", ""), _mib(row.get("used_memory")),
                              row.get("gpu_uuid", "")))
    return out


@dataclass(frozen=True)
class Inventory:
    """What the gpu_inventory probe found on one host."""

    available: bool  # nvidia-smi ran and answered
    reason: str  # why not, when not available
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    driver_cuda: str | None = None

    def by_index(self, index: int) -> Gpu | None:
        return next((gpu for gpu in self.gpus if gpu.index == index), None)

    @property
    def capabilities(self) -> list[tuple[int, int]]:
        return sorted({gpu.capability for gpu in self.gpus if gpu.capability is not None})


def _failed(result: Mapping[str, Any] | None) -> str | None:
    if result is None:
        return "not run"
    if result.get("rc") != 0:
        detail = (result.get("stderr") or result.get("stdout") or "").strip().splitlines()
        return (f"`{' '.join(result.get('argv', []))}` exited {result.get('rc')}: "
                f"{detail[-1] if detail else ''}")
    return None


def inventory_from_probe(probe: Mapping[str, Any]) -> Inventory:
    """The gpu_inventory probe's JSON -> Inventory (CSV for identity, XML for health, apps for processes)."""
    if probe.get("error"):
        return Inventory(False, str(probe["error"]))
    problem = _failed(probe.get("query"))
    if problem:
        return Inventory(False, problem)
    rows = parse_query_csv(probe["query"]["stdout"])
    xml = parse_xml(probe["xml"]["stdout"]) if _failed(probe.get("xml")) is None else XmlFacts(None, None)
    apps = parse_apps_csv(probe["apps"]["stdout"]) if _failed(probe.get("apps")) is None else []
    gpus = []
    for row in rows:
        bus = _bus(row.get("pci.bus_id", ""))
        health = xml.gpus.get(bus)
        uuid = row.get("uuid", "")
        cap = _value(row.get("compute_cap"))
        processes = tuple(p for p in apps if p.gpu == uuid) or (health.processes if health else ())
        gpus.append(Gpu(
            index=_int(row.get("index")) or 0,
            name=row.get("name", ""),
            uuid=uuid,
            bus_id=bus,
            capability=parse_capability(cap) if cap else None,
            driver=_value(row.get("driver_version")),
            memory_total_mib=_mib(row.get("memory.total")),
            memory_used_mib=_mib(row.get("memory.used")),
            persistence=_yes(row.get("persistence_mode")) if health is None else health.persistence,
            ecc_enabled=_yes(row.get("ecc.mode.current")) if health is None else health.ecc_enabled,
            ecc_uncorrected_volatile=health.ecc_uncorrected_volatile if health else None,
            ecc_uncorrected_aggregate=health.ecc_uncorrected_aggregate if health else None,
            retired_pending=health.retired_pending if health else None,
            retired_pages=health.retired_pages if health else None,
            remap_pending=health.remap_pending if health else None,
            remap_failure=health.remap_failure if health else None,
            processes=processes,
        ))
    driver = xml.driver or next((g.driver for g in gpus if g.driver), None)
    return Inventory(True, "", tuple(gpus), driver, xml.cuda)
