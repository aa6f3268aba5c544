"""One bad GPU of eight (tests/data/gpu/h200x8: the H200's real nvidia-smi output as an 8-GPU HGX board, with
NVIDIA's Xid 79 on GPU 5): the host layer names the GPU by index, bus id and UUID and raises errors.GpuFault,
which blocks only the services whose `gpus` include it (run/blocking.py); the services on healthy GPUs go on."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from gpu_data import DATA, load, recorded, recorded_gpu

from pytest_dflash.errors import GpuFault
from pytest_dflash.layers.gpu import host
from pytest_dflash.layers.gpu.checks import KERNEL_PATTERN
from pytest_dflash.run.blocking import Failure, LayerBook, blocked_reason

EIGHT = DATA / "h200x8"
PROFILE = """
[host]
name = "hgx"
connection = "local://"
python = "/opt/torch/.venv/bin/python3"
gpus = [0, 1, 2, 3, 4, 5, 6, 7]

[services.ddtree]
kind = "process"
algorithm = "DDTREE"
command = ["{python}", "-m", "sglang.launch_server", "--port", "{port}"]
gpus = [0]

[services.dflash]
kind = "process"
algorithm = "DFLASH"
command = ["{python}", "-m", "sglang.launch_server", "--port", "{port}"]
gpus = [1]

[services.kimi]
kind = "process"
algorithm = "EAGLE3"
command = ["{python}", "-m", "sglang.launch_server", "--port", "{port}", "--tp-size", "4"]
gpus = [4, 5, 6, 7]
"""


def _inventory() -> dict[str, Any]:
    inventory = copy.deepcopy(load("h200/layers/gpu_inventory.json"))
    inventory["query"]["stdout"] = (EIGHT / "query.csv").read_text()
    inventory["xml"]["stdout"] = (EIGHT / "q.xml").read_text()
    return inventory


def _kernel_log() -> dict[str, Any]:
    log = copy.deepcopy(load("h200/layers/kernel_log.json"))
    log["matches"] = [line for line in (EIGHT / "kernel.log").read_text().splitlines()
                      if re.search(KERNEL_PATTERN, line)]
    return log


def _hgx(tmp_path: Path, *, provision: bool = False, **replaced: Any) -> Any:
    (tmp_path / "hgx.toml").write_text(PROFILE)
    probes = recorded("h200/layers", **{"gpu_inventory": _inventory(), "kernel_log": _kernel_log(), **replaced})
    return recorded_gpu(tmp_path / "hgx.toml", probes, provision=provision, tmp_path=tmp_path)


def test_eight_gpus_are_listed_and_identified(tmp_path: Path) -> None:
    gpu = _hgx(tmp_path)
    assert [g.index for g in gpu.inventory.gpus] == list(range(8))
    assert gpu.inventory.by_index(5).bus_id == "0000:ab:00.0"
    host.profile_gpus_present(gpu)
    host.gpu_memory_healthy(gpu)
    host.gpu_identity_reported(gpu)
    matrix = gpu.host.facts.export["gpu_matrix"]
    assert sorted(matrix, key=int) == [str(i) for i in range(8)]
    assert [matrix[str(i)]["services"] for i in (0, 1, 2, 4)] == [["ddtree"], ["dflash"], [], ["kimi"]]
    assert all(entry["problems"] == [] for entry in matrix.values())


def test_an_xid_79_fails_only_the_gpu_it_names(tmp_path: Path) -> None:
    gpu = _hgx(tmp_path)
    with pytest.raises(GpuFault) as failed:
        host.kernel_log_has_no_gpu_faults(gpu)
    assert failed.value.gpus == (5,)
    assert failed.value.labels == ("GPU 5 (bus 0000:ab:00.0, GPU-caedbb52-a7ac-b6fb-867b-b909a3c8cf25)",)
    message = str(failed.value)
    assert "Xid codes [79]" in message and "services kimi" in message and "GPU has fallen off the bus" in message
    matrix = gpu.host.facts.export["gpu_matrix"]
    assert set(matrix) == {"5"} and matrix["5"]["services"] == ["kimi"]


def test_a_fault_line_that_names_no_gpu_of_the_host_fails_the_whole_host(tmp_path: Path) -> None:
    log = _kernel_log()
    log["matches"] = ["[ 1.0] NVRM: Xid (PCI:0000:ee:00): 79, pid=1, name=x, GPU has fallen off the bus."]
    gpu = _hgx(tmp_path, kernel_log=log)
    with pytest.raises(AssertionError) as failed:
        host.kernel_log_has_no_gpu_faults(gpu)
    assert not isinstance(failed.value, GpuFault)


def test_memory_held_on_one_gpu_fails_that_gpu(tmp_path: Path) -> None:
    inventory = _inventory()
    uuid = "GPU-caedbb52-a7ac-b6fb-867b-b909a3c8cf21"
    inventory["apps"]["stdout"] += f"{uuid}, 4242, python3, 70000 MiB\n"
    gpu = _hgx(tmp_path, provision=True, gpu_inventory=inventory)  # checked before this run starts its services
    with pytest.raises(GpuFault) as failed:
        host.service_gpus_not_held_by_other_processes(gpu)
    assert failed.value.gpus == (1,) and "pid 4242" in str(failed.value) and "services dflash" in str(failed.value)


def test_a_gpu_fault_blocks_only_the_services_on_that_gpu() -> None:
    book = LayerBook(service_gpus={("hgx", "ddtree"): (0,), ("hgx", "dflash"): (1,), ("hgx", "kimi"): (4, 5, 6, 7),
                                   ("hgx", "any"): ()})
    book.record(Failure("hgx", "host", None, "suites/host/test_host.py::test_kernel_log_has_no_gpu_faults[hgx]",
                        "[gpu-xid] ..."))
    book.scope_to_gpus("suites/host/test_host.py::test_kernel_log_has_no_gpu_faults[hgx]", (5,),
                       ("GPU 5 (bus 0000:ab:00.0, GPU-…25)",))
    assert book.blocker("hgx", "service", ["ddtree"]) is None
    assert book.blocker("hgx", "generation", ["dflash"]) is None
    assert book.blocker("hgx", "env", []) is None  # host-wide checks go on
    blocked = book.blocker("hgx", "service", ["kimi"])
    assert blocked is not None and "GPU 5 (bus 0000:ab:00.0" in blocked_reason(blocked)
    assert book.blocker("hgx", "service", ["any"]) is not None  # a service naming no GPU may be on it
    book.record(Failure("hgx", "host", None, "t2", "nvidia-smi did not answer"))  # a host-wide failure
    assert book.blocker("hgx", "service", ["ddtree"]) is not None
