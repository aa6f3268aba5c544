"""The probe scripts, run for real on this machine (no GPU, nvcc 13.0, no curand headers, no driver)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.errors import TransportError
from pytest_dflash.hostaccess.transport import CommandResult, parse_probe_output
from pytest_dflash.layers.gpu.layer import SITELESS_PROBES, probe_source

PROBES = ["gpu_inventory", "kernel_log", "torch_facts", "import_chain", "packages", "cuda_toolkit",
          "sgl_kernel_builds", "jit_cache", "kernels"]


def run_probe(name: str, params: dict[str, Any] | None = None, *, env: dict[str, str] | None = None,
              timeout: float = 120, site: bool = True) -> dict[str, Any]:
    """Exactly as the transport sends it: the source on stdin of `python -` (`python -S -`), params as argv[1]."""
    python = [sys.executable] if site else [sys.executable, "-S"]
    done = subprocess.run([*python, "-", json.dumps(params or {})], input=probe_source(name), text=True,
                          capture_output=True, timeout=timeout, env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, done.stderr
    assert len([line for line in done.stdout.splitlines() if line.startswith("{")]) == 1, done.stdout
    return parse_probe_output(CommandResult("probe", done.returncode, done.stdout, done.stderr, 0.0), host="local")


def test_a_probe_line_nested_too_deep_is_no_json_output() -> None:
    """The host printed `{` and 20,000 more levels: a TransportError naming the host, not a RecursionError."""
    deep = '{"a":' * 20_000
    with pytest.raises(TransportError, match="^gpu7: probe printed no JSON"):
        parse_probe_output(CommandResult("probe", 0, deep + "\n", "", 0.0), host="gpu7")


@pytest.mark.parametrize("name", PROBES)
def test_probes_never_import_the_plugin(name: str) -> None:
    tree = ast.parse(probe_source(name))
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(m.startswith("pytest_dflash") for m in modules)
    assert "pytest_dflash" not in probe_source(name).split('"""', 2)[-1].replace("pytest_dflash.refserver", "")


@pytest.mark.parametrize("name", sorted(SITELESS_PROBES))
def test_the_probes_sent_to_python_dash_s_need_only_the_standard_library(name: str) -> None:
    tree = ast.parse(probe_source(name))
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names) | {"__future__"}
    params = {"pattern": r"NVRM: Xid"} if name == "kernel_log" else {}
    sited, siteless = run_probe(name, params), run_probe(name, params, site=False)
    assert siteless["probe"] == name and siteless.keys() == sited.keys()


def test_gpu_inventory_without_nvidia_smi() -> None:
    out = run_probe("gpu_inventory", env={"PATH": "/usr/bin:/bin"})
    assert out == {"probe": "gpu_inventory", "nvidia_smi": None, "query": None, "xml": None, "apps": None,
                   "error": "nvidia-smi not found on PATH"}


def test_kernel_log_reads_and_filters() -> None:
    # A line of our own in the kernel log (root: /dev/kmsg), not the boot banner: a busy machine's ring buffer
    # (the container OOM scenarios log dozens of lines each) no longer holds "Linux version".
    marker = f"dflash-kernel-log-probe-{uuid.uuid4().hex[:12]}"
    try:
        Path("/dev/kmsg").write_text(marker + "\n")
    except OSError as exc:
        pytest.skip(f"cannot write a line to the kernel log here: {exc}")
    out = run_probe("kernel_log", {"pattern": marker})
    if not out["readable"]:
        pytest.skip(f"kernel log not readable here: {out['attempts']}")
    assert out["total_lines"] > 0 and any(marker in line for line in out["matches"]), out
    assert run_probe("kernel_log", {"pattern": r"NVRM: Xid"})["matches"] == []


def test_torch_facts_of_a_cpu_build() -> None:
    torch = run_probe("torch_facts")["torch"]
    assert torch["version"].endswith("+cpu") and torch["cuda"] is None
    assert torch["cuda_available"] is False and torch["devices"] == []


def test_torch_facts_reports_an_import_failure(tmp_path: Path) -> None:
    (tmp_path / "torch.py").write_text("raise ImportError('libtorch_cuda.so: undefined symbol: cudaGraphX')\n")
    out = run_probe("torch_facts", env={"PYTHONPATH": str(tmp_path)})
    assert out["torch"] is None and "undefined symbol: cudaGraphX" in out["import_error"]


def test_import_chains_in_fresh_interpreters(tmp_path: Path) -> None:
    (tmp_path / "dflash_slow_module.py").write_text("import time\ntime.sleep(30)\n")
    out = run_probe("import_chain", {"timeout_s": 3, "chains": [
        {"name": "ok", "modules": ["json", "email.parser"]},
        {"name": "missing", "modules": ["json", "dflash_no_such_module"]},
        {"name": "slow", "modules": ["dflash_slow_module"]},
    ]}, env={"PYTHONPATH": str(tmp_path)})
    ok, missing, slow = out["chains"]
    assert ok["ok"] and [m["module"] for m in ok["imported"]] == ["json", "email.parser"]
    assert not missing["ok"] and missing["failed"]["missing"] == "dflash_no_such_module"
    assert missing["failed"]["traceback"].endswith("No module named 'dflash_no_such_module'")
    assert [m["module"] for m in missing["imported"]] == ["json"]
    assert slow["timed_out"] and not slow["ok"]


def test_import_chain_leaves_the_services_jit_cache_alone(tmp_path: Path) -> None:
    out = run_probe("import_chain", {"chains": [{"name": "flashinfer", "modules": ["flashinfer"]}]},
                    env={"HOME": str(tmp_path)}, timeout=180)
    if not out["chains"][0]["ok"]:
        pytest.skip(f"flashinfer does not import here: {out['chains'][0]['failed']}")
    assert not (tmp_path / ".cache" / "flashinfer").exists()


def test_packages_metadata_and_pip_check() -> None:
    out = run_probe("packages", {"requirers": ["pytest"], "pip_check": True})
    assert out["distributions"]["pytest"]["version"]
    assert any(req.startswith("pluggy") for req in out["requires"]["pytest"])
    assert out["marker_env"]["python_version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert out["pip_check"]["ran"] and out["pip_check"]["rc"] in (0, 1)


def test_cuda_toolkit_follows_flashinfers_order() -> None:
    from_path = run_probe("cuda_toolkit")
    if from_path["which_nvcc"] is None:
        pytest.skip("no nvcc on this machine")
    assert from_path["resolution"]["source"] == "which nvcc"
    home = run_probe("cuda_toolkit", env={"CUDA_HOME": "/usr/local/cuda"})
    assert home["resolution"] == {"home": "/usr/local/cuda", "source": "CUDA_HOME", "error": None}
    assert home["headers"]["cuda_runtime.h"] and home["libraries"]["cudart"] == "/usr/local/cuda/lib64/libcudart.so"
    empty = run_probe("cuda_toolkit", env={"CUDA_HOME": "", "CUDA_PATH": "/usr/local/cuda"})
    assert empty["resolution"]["source"] == "CUDA_PATH"  # an empty CUDA_HOME counts as unset, as in FlashInfer


def test_sgl_kernel_builds_absent_here() -> None:
    assert run_probe("sgl_kernel_builds")["found"] is False


def test_jit_cache_lists_modules_read_only(tmp_path: Path) -> None:
    ops = tmp_path / ".cache" / "flashinfer" / "0.6.15.post1" / "90a" / "cached_ops"
    (ops / "sampling").mkdir(parents=True)
    (ops / "sampling" / "sampling.so").write_bytes(b"\x7fELF")
    (ops / "norm").mkdir()
    (ops / "tmp").mkdir()
    (ops.parent / "flashinfer_jit.log").write_text("")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    out = run_probe("jit_cache", env={"FLASHINFER_WORKSPACE_BASE": str(tmp_path)})
    assert out["base_source"] == "FLASHINFER_WORKSPACE_BASE"
    assert [(m["module"], m["library"]) for m in out["modules"]] == [("norm", False), ("sampling", True)]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert run_probe("jit_cache", env={"HOME": str(tmp_path / "nobody")})["exists"] is False


def test_kernels_probe_reports_flashinfers_own_rejection_and_cleans_up() -> None:
    out = run_probe("kernels", {"step": "sampling", "mode": "compile", "arch_list": "7.0"}, timeout=300)
    error: dict[str, Any] = (out["result"] or {}).get("error") or {}
    if error.get("phase") == "import":
        pytest.skip(f"flashinfer does not import here: {error['message']}")
    assert not out["ok"] and error["phase"] == "spec"
    assert error["message"].startswith("FlashInfer requires GPUs with sm75 or higher")
    assert out["workspace_removed"] and not Path(out["workspace"]).exists()


def test_the_transport_sends_a_siteless_probe_to_python_dash_s(tmp_path: Path) -> None:
    from pytest_dflash.config.loader import load_profile
    from pytest_dflash.hostaccess.transport import Transport

    path = tmp_path / "h.toml"
    path.write_text(f'[host]\nconnection = "local://"\npython = "{sys.executable}"\n\n[services.s]\nkind = "external"\n'
                    'algorithm = "auto"\nurl = "http://127.0.0.1:9"\n')
    transport = Transport(load_profile(path), read_only=True)
    script = "import json, sys\nprint(json.dumps({'no_site': sys.flags.no_site}))\n"
    assert transport.probe(script, site=False) == {"no_site": 1}
    assert transport.probe(script) == {"no_site": 0}
