"""The kernels layer's compile step on this CPU machine, with REAL nvcc runs (marked slow).

Cost control: `--jit-objects renorm` compiles one of the sampling module's three sources (renorm.cu:
it includes sampling.cuh -> curand.h, so it shows both the failing and the passing compile, ~40-60 s
on 2 cores instead of ~2 min for all three) and skips the link. The full build (all three objects, then
the real `cannot find -lcudart / -lcuda` link failure) is recorded in tests/data/gpu/cpu-nvcc13/ and
checked by test_gpu_catalog.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_data import SUITES

from pytest_dflash.layers.gpu.layer import probe_source

pytestmark = pytest.mark.slow


def _toolkit(env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-", "{}"], input=probe_source("cuda_toolkit"), text=True,
                          capture_output=True, timeout=60, check=True, env={**os.environ, **(env or {})})
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def curand_include() -> str:
    spec = importlib.util.find_spec("nvidia")
    paths = list(spec.submodule_search_locations or []) if spec else []
    for base in paths:
        include = Path(base) / "cu13" / "include"
        if (include / "curand.h").is_file():
            return str(include)
    pytest.skip("nvidia-curand is not installed in this venv")


@pytest.fixture(autouse=True)
def _jit_toolchain() -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on this machine")
    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer-python is not installed in this venv")


def _profile(tmp_path: Path, env: dict[str, str]) -> Path:
    lines = ["[host]", 'connection = "local://"', f"python = {json.dumps(sys.executable)}", "",
             "[services.dflash]", 'kind = "process"', 'algorithm = "DFLASH"',
             'command = ["{python}", "-m", "sglang.launch_server", "--port", "{port}"]']
    if env:
        lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }")
    path = tmp_path / "cpu-jit.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(pytester: pytest.Pytester, tmp_path: Path, env: dict[str, str]) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        str(SUITES / "kernels"), "-p", "no:cacheprovider", "-rA", f"--dflash-report={tmp_path / 'r'}",
        "--host", str(_profile(tmp_path, env)), "--jit-arch-list=9.0", "--jit-objects=renorm", "--jit-jobs=1",
        "--allow-gpu-use", "-k", "sampling")  # the profile attaches: building needs the opt-in


def test_compile_fails_on_missing_curand_header(pytester: pytest.Pytester, tmp_path: Path) -> None:
    if (_toolkit().get("headers") or {}).get("curand.h"):
        pytest.skip("this machine's CUDA toolkit has curand.h: the failing compile cannot happen here")
    result = _run(pytester, tmp_path, {})
    out = result.stdout.str()
    assert result.ret == 1, out
    result.stdout.fnmatch_lines(["*FAILED*test_flashinfer_sampling_builds_cold*[[]curand-header-missing[]]*"])
    assert "sampling.cuh:20:10: fatal error: curand.h: No such file or directory" in out  # nvcc's own words
    assert "-gencode=arch=compute_90a,code=sm_90a" in out  # compiled for the configured arch list
    result.stdout.fnmatch_lines(["*SKIPPED*no GPU on cpu-jit*only the compile step runs here*"])


def test_compile_passes_with_curand_headers_on_the_services_cpath(pytester: pytest.Pytester, tmp_path: Path,
                                                                   curand_include: str) -> None:
    result = _run(pytester, tmp_path, {"CPATH": curand_include})
    out = result.stdout.str()
    assert result.ret == 0, out
    result.stdout.fnmatch_lines(["*cold JIT cpu-jit sampling: ok (compile only, 9.0) build *(csrc_renorm.cuda.o *",
                                 "*PASSED*test_flashinfer_sampling_builds_cold*"])
