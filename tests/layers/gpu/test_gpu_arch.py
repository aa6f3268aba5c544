"""Architecture rules: which builds run on which GPU, and FlashInfer's per-version SM 12.x rule."""

from __future__ import annotations

import pytest
from gpu_data import load

from pytest_dflash.layers.gpu.arch import (
    Arch,
    coverage,
    flashinfer_eligible,
    flashinfer_target,
    parse_arch_list,
    parse_capability,
    parse_target,
    sgl_kernel_build,
)

H200_TORCH_ARCHS = load("h200/layers/torch_facts.json")["torch"]["arch_list"]


@pytest.mark.parametrize(("text", "name", "capability", "ptx"), [
    ("sm_90", "sm_90", (9, 0), False),
    ("sm_90a", "sm_90a", (9, 0), False),
    ("compute_90", "compute_90", (9, 0), True),
    ("sm_120", "sm_120", (12, 0), False),  # the last digit is the minor: 12.0, not 1.20
    ("sm_100", "sm_100", (10, 0), False),
    ("sm_86", "sm_86", (8, 6), False),
    ("12.0f", "sm_120f", (12, 0), False),
    ("9.0", "sm_90", (9, 0), False),
])
def test_parse_target(text: str, name: str, capability: tuple[int, int], ptx: bool) -> None:
    target = parse_target(text)
    assert (target.name, target.arch.capability, target.ptx) == (name, capability, ptx)


@pytest.mark.parametrize("bad", ["sm90", "hopper", "9", "compute_", ""])
def test_parse_target_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a CUDA architecture"):
        parse_target(bad)


def test_torch_cu130_covers_the_h200_with_sass() -> None:
    cov = coverage(H200_TORCH_ARCHS, (9, 0))
    assert cov.ok and cov.covered_by == "sm_90"


def test_sm_120_sass_is_blackwell_not_a_higher_hopper() -> None:
    assert coverage(["sm_120"], (12, 0)).ok
    assert not coverage(["sm_120"], (9, 0)).ok
    assert not coverage(["sm_90"], (12, 0)).ok  # SASS only runs within its major


def test_sass_runs_on_higher_minor_of_same_major_only() -> None:
    assert coverage(["sm_80"], (8, 6)).covered_by == "sm_80"
    assert not coverage(["sm_86"], (8, 0)).ok
    assert not coverage(["sm_90a"], (9, 1)).ok  # arch-specific: exactly 9.0


def test_ptx_runs_on_any_later_gpu() -> None:
    assert coverage(["sm_80", "compute_80"], (12, 0)).covered_by == "compute_80"
    assert not coverage(["compute_120"], (9, 0)).ok


def test_coverage_explains_a_gap() -> None:
    cov = coverage(["sm_75", "sm_80", "sm_86"], (9, 0))
    assert not cov.ok
    assert "9.0" in cov.describe() and "sm_86" in cov.describe()


@pytest.mark.parametrize(("fi", "cuda", "cache_dir", "error"), [
    ("0.6.15.post1", "12.8", None, "SM 12.x requires CUDA >= 12.9"),  # seeds 000/004
    ("0.6.15.post1", "12.9", "120f", None),
    ("0.6.15.post1", "13.0", "120f", None),
    ("0.7.0", "12.8", None, "SM 12.x requires CUDA >= 12.9"),
    ("0.7.1", "12.8", "120a", None),  # relaxed from 0.7.1 on
    ("0.7.2.post1", "12.6", None, "SM 120 requires CUDA >= 12.8"),
    ("0.7.2.post1", "13.0", "120f", None),
])
def test_flashinfer_sm120_rule(fi: str, cuda: str, cache_dir: str | None, error: str | None) -> None:
    target = flashinfer_target((12, 0), cuda, fi)
    assert (target.cache_dir, target.error) == (cache_dir, error)
    assert flashinfer_eligible([target]) is (error is None)


def test_flashinfer_sm121_needs_12_9_in_every_version() -> None:
    assert flashinfer_target((12, 1), "12.8", "0.7.2.post1").error == "SM 12.1+ requires CUDA >= 12.9"
    assert flashinfer_target((12, 1), "12.9", "0.6.15.post1").cache_dir == "121a"


def test_flashinfer_hopper_is_90a_as_recorded_on_the_h200() -> None:
    recorded = load("h200/layers/kernels_sampling.json")["result"]["flashinfer"]
    target = flashinfer_target((9, 0), recorded["cuda_version"], recorded["version"])
    assert target.cache_dir == recorded["workspace_dir"].rsplit("/", 1)[-1] == "90a"
    assert target.arch is not None
    assert [[target.arch.major, f"{target.arch.minor}{target.arch.suffix}"]] == recorded["target_archs"] == [[9, "0a"]]


def test_flashinfer_rejects_old_gpus_and_too_old_nvcc() -> None:
    assert not flashinfer_eligible([flashinfer_target((7, 0), "13.0", "0.7.2.post1")])
    assert flashinfer_target((10, 0), "12.6", "0.7.2.post1").error == "nvcc 12.6 cannot generate code for sm_100a " \
        "(needs CUDA >= 12.8)"


def test_arch_list_and_capability_parsing() -> None:
    assert parse_arch_list("9.0 12.0f") == [(9, 0), (12, 0)]
    assert parse_capability(" 12.0 ") == (12, 0)
    with pytest.raises(ValueError, match="not a compute capability"):
        parse_capability("sm_90")
    assert Arch(12, 0, "f").sm == "sm_120f"


def test_sgl_kernel_loads_sm90_on_hopper_only() -> None:
    assert sgl_kernel_build((9, 0)) == "sm90"
    assert sgl_kernel_build((10, 0)) == sgl_kernel_build((12, 0)) == sgl_kernel_build((8, 0)) == "sm100"
