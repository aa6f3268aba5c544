"""Diagnosis signatures of the GPU layers against REAL text: compiler/linker output produced on the CPU
machine, runtime/Triton/import errors produced on the H200, and SGLang's recorded logs."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_data import load, text

from pytest_dflash.evidence.diagnosis import default_catalog, diagnose

SGLANG_LOGS = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h200" / "logs"


def first(*texts: str) -> str:
    found = diagnose(*texts)
    assert found, "no diagnosis"
    return found[0].id


def compile_log(path: str) -> str:
    """What the kernels layer puts in its failure: the ninja output, the link output, `Type: message`."""
    result = load(path)["result"]
    error = result.get("error")
    return "\n".join(filter(None, [(result.get("compile") or {}).get("log"), (result.get("link") or {}).get("log"),
                                   f"{error['type']}: {error['message']}" if error else None]))


def chain_message(path: str, chain: str) -> str:
    return str(next(c["failed"]["message"] for c in load(path)["chains"] if c["name"] == chain))


@pytest.mark.parametrize(("source", "expected"), [
    (lambda: compile_log("cpu-nvcc13/kernels_sampling_no_curand.json"), "curand-header-missing"),
    (lambda: compile_log("cpu-nvcc13/kernels_sampling_cpath.json"), "cannot-find-libcuda"),
    (lambda: compile_log("cpu-nvcc13/kernels_sampling_sm70.json"), "flashinfer-no-eligible-arch"),
    (lambda: text("cpu-nvcc13/no_driver.txt"), "cuda-driver-too-old"),
    (lambda: chain_message("h200/faults/import_chain.json", "sgl_kernel"), "sgl-kernel-undefined-symbol"),
    (lambda: text("h200/faults/no_kernel_image.txt"), "no-kernel-image"),
    (lambda: text("h200/faults/triton_compile_error.txt"), "triton-compile-error"),
    (lambda: compile_log("h200/broken/kernels_sampling.json"), "nvcc-rejects-flags"),
    (lambda: (SGLANG_LOGS / "S1_no_soundfile.log").read_text(), "soundfile-missing"),
    (lambda: (SGLANG_LOGS / "S2a_no_StructuralTag_grammar_none.log").read_text(), "xgrammar-structural-tag"),
    (lambda: (SGLANG_LOGS / "S3b_sampling_jit_no_curand_headers.log").read_text(), "curand-header-missing"),
], ids=["curand.h", "-lcudart/-lcuda", "sm75-or-higher", "driver-insufficient", "sgl_kernel-undefined-symbol",
        "no-kernel-image", "triton-CompilationError", "nvcc-unknown-option", "soundfile", "StructuralTag",
        "curand_kernel.h-in-sglang"])
def test_real_failure_text_gets_its_diagnosis(source, expected: str) -> None:  # type: ignore[no-untyped-def]
    assert first(source()) == expected


def test_sm12x_line_wins_over_the_misleading_sm75_message() -> None:
    seed = ("Failed to get device capability: SM 12.x requires CUDA >= 12.9.\n"
            + compile_log("cpu-nvcc13/kernels_sampling_sm70.json"))
    found = diagnose(seed)
    # one root cause, one diagnosis: the misleading sm75 line is the same event, folded into the toolkit's
    assert [d.id for d in found] == ["flashinfer-sm12x-nvcc"]
    assert "flashinfer-no-eligible-arch" in found[0].folded
    assert first("RuntimeError: SM 120 requires CUDA >= 12.8") == "flashinfer-sm12x-nvcc"  # flashinfer >= 0.7.1


def test_link_failure_also_names_the_failed_build() -> None:
    (found,) = diagnose(compile_log("cpu-nvcc13/kernels_sampling_cpath.json"))
    assert found.id == "cannot-find-libcuda" and found.folded == ("jit-ninja-build-failed",)


@pytest.mark.parametrize("path", ["h200/layers/kernels_sampling.json", "h200/layers/kernels_decode.json"])
def test_successful_builds_trigger_nothing(path: str) -> None:
    log = compile_log(path)
    assert "-lcudart" in log or "nvcc" in log  # a real, verbose build log
    assert diagnose(log) == []


def test_new_signatures_are_well_formed() -> None:
    catalog = default_catalog()
    for sig_id in ("flashinfer-no-eligible-arch", "nvcc-rejects-flags"):
        sig = catalog.by_id(sig_id)
        assert sig.title and sig.remedy and sig.layer and sig.seen
