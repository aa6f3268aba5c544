"""The host / env / kernels layers end to end: real pytest runs (pytester subprocesses) of the real suites
against this CPU machine, and the issue's "Done when" for a venv without soundfile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_data import SUITES, venv_without
from support.pytest_runs import verdict

REFSERVER = ["{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
             "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8"]


def profile(directory: Path, name: str, python: str, *, command: list[str] | None = None,
            env: dict[str, str] | None = None, provision: str = "always") -> Path:
    lines = ["[host]", 'connection = "local://"', f"python = {json.dumps(python)}", f'provision = "{provision}"', "",
             "[services.dflash]", 'kind = "process"', 'algorithm = "DFLASH"',
             f"command = {json.dumps(command or REFSERVER)}", 'ready_timeout = "60s"']
    if env:
        lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }")
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(pytester: pytest.Pytester, reports: Path, suites: list[str], *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*[str(SUITES / s) for s in suites], "-p", "no:cacheprovider", "-rA",
                                         f"--dflash-report={reports}", *args)


def test_cpu_host_layer_skips_gpu_checks_with_the_reason(pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = profile(tmp_path, "cpu", sys.executable)
    result = run(pytester, tmp_path / "r", ["host"], "--host", str(host))
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["skipped"] >= 5, result.stdout.str()
    result.stdout.fnmatch_lines(["*SKIPPED*no GPU on cpu: nvidia-smi not found on PATH*"])


def test_a_profile_naming_gpus_fails_the_host_layer_and_blocks_the_rest(pytester: pytest.Pytester,
                                                                        tmp_path: Path) -> None:
    host = profile(tmp_path, "gpuless", sys.executable)
    host.write_text(host.read_text().replace('provision = "always"', 'provision = "always"\ngpus = [0]'))
    result = run(pytester, tmp_path / "r", ["host", "env"], "--host", str(host))
    result.stdout.fnmatch_lines(["*FAILED*test_nvidia_smi_lists_gpus*the profile names GPUs [[]0[]] but nvidia-smi "
                                 "did not answer: nvidia-smi not found on PATH*"])
    layers = verdict(tmp_path / "r", "gpuless")["layers"]
    assert layers["host"]["outcome"] == "failed" and layers["env"]["outcome"] == "blocked", layers


def test_env_layer_fails_a_venv_without_soundfile_before_any_service_starts(pytester: pytest.Pytester,
                                                                            tmp_path: Path) -> None:
    """The issue's "Done when": the env layer names the soundfile diagnosis; the service is never started."""
    python = venv_without(tmp_path, "soundfile")
    probe = subprocess.run([str(python), "-c", "import soundfile"], capture_output=True, text=True, timeout=60)
    assert "No module named 'soundfile'" in probe.stderr  # the venv really lacks it ...
    subprocess.run([str(python), "-c", "import torch, fastapi, pytest_dflash.refserver.server_args"], check=True,
                   timeout=120)  # ... and only it
    host = profile(tmp_path, "nosoundfile", str(python))
    result = run(pytester, tmp_path / "r", ["env", "smoke"], "--host", str(host))
    result.stdout.fnmatch_lines([
        "*FAILED*test_import_chain*nosoundfile-refserver_http*[[]soundfile-missing[]]*",
    ])
    assert f"remedy: install it into the server's venv: {python} -m pip install soundfile==0.13.1" in \
        result.stdout.str()
    data = verdict(tmp_path / "r", "nosoundfile")
    assert data["layers"]["env"]["outcome"] == "failed"
    assert data["layers"]["service"]["outcome"] == "blocked", data["layers"]
    assert "started (http" not in result.stdout.str()  # the core prints "<host>/<service>: started (url)"
    assert not list(Path(tmp_path).glob("**/dflash*.log"))


def test_env_snapshot_then_baseline_drift(pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = profile(tmp_path, "snap", sys.executable)
    snap = tmp_path / "good.json"
    saved = run(pytester, tmp_path / "r1", ["env"], "--host", str(host), "-k", "baseline",
                f"--save-env-snapshot={snap}")
    saved.stdout.fnmatch_lines([f"*env snapshot of snap: {snap}*"])
    saved.stdout.fnmatch_lines(["*SKIPPED*no --env-baseline given*"])
    data = json.loads(snap.read_text())
    assert data["hosts"]["snap"]["packages"]["torch"]
    same = run(pytester, tmp_path / "r2", ["env"], "--host", str(host), "-k", "baseline", f"--env-baseline={snap}")
    assert same.parseoutcomes()["passed"] == 1 and same.ret == 0, same.stdout.str()
    data["hosts"]["snap"]["packages"]["torch"] = "2.11.0+cu128"
    data["hosts"]["snap"]["packages"]["pytest"] = "1.0"
    snap.write_text(json.dumps(data))
    drift = run(pytester, tmp_path / "r3", ["env"], "--host", str(host), "-k", "baseline", f"--env-baseline={snap}")
    drift.stdout.fnmatch_lines(["*the serving stack differs from the baseline*", "*torch: 2.11.0+cu128 -> *"])
    assert "pytest: 1.0" not in drift.stdout.str().split("warnings summary")[0]  # non-serving: a warning only


@pytest.mark.parametrize(("option", "message"), [
    ("--jit-arch-list=hopper", "--jit-arch-list / dflash_jit_arch_list: not a CUDA architecture: 'hopper'"),
    ("--jit-jobs=0", "--jit-jobs / dflash_jit_jobs: '0' must be >= 1"),
    ("--jit-jobs=two", "--jit-jobs / dflash_jit_jobs: 'two' is not an integer"),
    ("--env-baseline=/nonexistent/good.json", "--env-baseline / dflash_env_baseline: /nonexistent/good.json does "
                                              "not exist"),
    ("--kernels-timeout=soon", "--kernels-timeout / dflash_kernels_timeout: 'soon' is not a duration"),
])
def test_bad_options_are_usage_errors(pytester: pytest.Pytester, tmp_path: Path, option: str, message: str) -> None:
    result = run(pytester, tmp_path / "r", ["env"], "--host", str(profile(tmp_path, "x", sys.executable)), option)
    assert result.ret == 4
    assert any(message in line for line in result.stderr.lines), result.stderr.lines
