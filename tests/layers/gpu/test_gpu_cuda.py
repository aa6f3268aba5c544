"""Driver vs CUDA runtime minimums and nvcc's version text (recorded on the H200 and the CPU machine)."""

from __future__ import annotations

import pytest
from gpu_data import load

from pytest_dflash.layers.gpu.cuda import check_driver, driver_api_to_release, driver_tuple, nvcc_release


def test_h200_driver_fully_supports_torch_cu130() -> None:
    torch = load("h200/layers/torch_facts.json")["torch"]
    check = check_driver(torch["cuda"], "580.159.04")
    assert check.ok and check.full and check.needs_exact == "580.65.06"


def test_cuda_13_on_a_cuda_12_driver_is_too_old() -> None:
    check = check_driver("13.0", "575.57.08")
    assert not check.ok
    assert check.describe() == "driver 575.57.08 is too old for CUDA 13.0: it needs >= 580.65.06"


def test_minor_version_compatibility_within_a_major() -> None:
    check = check_driver("12.8", "535.183.01")  # a 12.2 driver running a cu128 torch
    assert check.ok and not check.full
    assert "minor-version compatibility" in check.describe()
    assert not check_driver("12.8", "520.61.05").ok


def test_unknown_release_falls_back_to_what_the_driver_reports() -> None:
    assert check_driver("14.1", "600.10", driver_cuda="14.2").ok
    assert not check_driver("14.1", "590.10", driver_cuda="13.2").ok


def test_nvcc_release_from_recorded_text() -> None:
    text = load("h200/layers/cuda_toolkit.json")["nvcc"]["text"]
    assert nvcc_release(text) == "13.0"
    assert nvcc_release(load("cpu-nvcc13/cuda_toolkit.json")["nvcc"]["text"]) == "13.0"
    assert nvcc_release("nvcc: command not found") is None


def test_driver_versions_parse() -> None:
    assert driver_tuple("580.159.04") == (580, 159, 4)
    assert driver_api_to_release(13000) == "13.0" and driver_api_to_release(12080) == "12.8"
    with pytest.raises(ValueError, match="not a driver version"):
        driver_tuple("N/A")
