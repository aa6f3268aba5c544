"""nvidia-smi parsing against the outputs recorded on the H200 (tests/data/gpu/h200, sglang-0.5.17-h200)."""

from __future__ import annotations

import pytest
from gpu_data import load, text

from pytest_dflash.layers.gpu.smi import (
    SmiParseError,
    inventory_from_probe,
    parse_apps_csv,
    parse_query_csv,
    parse_xml,
)


def test_query_csv_from_the_h200() -> None:
    rows = parse_query_csv(load("h200/layers/gpu_inventory.json")["query"]["stdout"])
    assert len(rows) == 1
    row = rows[0]
    assert row["name"] == "NVIDIA H200"
    assert row["compute_cap"] == "9.0"
    assert row["memory.total"] == "143771 MiB"  # units stay in the value, not in the key
    assert row["driver_version"] == "580.159.04"


def test_inventory_joins_csv_and_xml() -> None:
    inventory = inventory_from_probe(load("h200/layers/gpu_inventory.json"))
    assert inventory.available and inventory.driver == "580.159.04" and inventory.driver_cuda == "13.0"
    (gpu,) = inventory.gpus
    assert (gpu.index, gpu.name, gpu.capability) == (0, "NVIDIA H200", (9, 0))
    assert gpu.memory_total_mib == 143771.0 and gpu.memory_used_mib is not None
    assert gpu.persistence is True and gpu.ecc_enabled is True
    assert gpu.ecc_uncorrected_volatile == 0 and gpu.ecc_uncorrected_aggregate == 0
    assert gpu.retired_pending is None  # "N/A" on the H200: it remaps rows instead
    assert gpu.remap_pending is False and gpu.remap_failure is False
    assert gpu.processes == ()
    assert inventory.capabilities == [(9, 0)]


def test_xml_recorded_during_the_sglang_run() -> None:
    facts = parse_xml(text("sglang-0.5.17-h200/nvidia-smi-q.xml"))
    assert facts.driver == "580.159.04" and facts.cuda == "13.0"
    (gpu,) = facts.gpus.values()
    assert gpu.bus_id == "0000:00:06.0"  # "00000000:00:06.0" normalised


def test_missing_nvidia_smi_is_a_reason_not_an_error() -> None:
    inventory = inventory_from_probe(load("cpu-nvcc13/gpu_inventory.json"))
    assert not inventory.available and inventory.reason == "nvidia-smi not found on PATH" and not inventory.gpus


def test_failing_query_names_the_command() -> None:
    probe = {"error": None, "query": {"argv": ["nvidia-smi", "--query-gpu=x"], "rc": 9, "stdout": "",
                                      "stderr": "NVIDIA-SMI has failed because it couldn't communicate with the "
                                                "NVIDIA driver."}}
    inventory = inventory_from_probe(probe)
    assert not inventory.available
    assert "exited 9" in inventory.reason and "couldn't communicate with the NVIDIA driver" in inventory.reason


def test_xml_processes_and_apps_csv() -> None:
    xml = text("sglang-0.5.17-h200/nvidia-smi-q.xml").replace(
        "<processes>\n\t\t</processes>",
        "<processes><process_info><pid>1780</pid><type>C</type><process_name>python3</process_name>"
        "<used_memory>137000 MiB</used_memory></process_info></processes>")
    (gpu,) = parse_xml(xml).gpus.values()
    assert [(p.pid, p.name, p.used_mib) for p in gpu.processes] == [(1780, "python3", 137000.0)]
    apps = parse_apps_csv("gpu_uuid, pid, process_name, used_memory [MiB]\nGPU-f8cc, 1780, python3, 137000 MiB\n")
    assert [(a.gpu, a.pid, a.used_mib) for a in apps] == [("GPU-f8cc", 1780, 137000.0)]


def test_ecc_counts_sum_across_layouts() -> None:
    hopper = text("sglang-0.5.17-h200/nvidia-smi-q.xml").replace(
        "<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>3</dram_uncorrectable>", 1)
    (gpu,) = parse_xml(hopper).gpus.values()
    assert gpu.ecc_uncorrected_volatile == 3
    older = ("<nvidia_smi_log><gpu id='00000000:01:00.0'><ecc_errors><volatile><single_bit><total>7</total>"
             "</single_bit><double_bit><total>2</total></double_bit></volatile></ecc_errors></gpu></nvidia_smi_log>")
    (gpu,) = parse_xml(older).gpus.values()
    assert gpu.ecc_uncorrected_volatile == 2  # only double-bit (uncorrectable) errors count


def test_garbage_is_a_parse_error() -> None:
    with pytest.raises(SmiParseError, match="not XML"):
        parse_xml("NVIDIA-SMI has failed")
    with pytest.raises(SmiParseError, match="3 fields, header has 2"):
        parse_query_csv("a, b\n1, 2, 3\n")
