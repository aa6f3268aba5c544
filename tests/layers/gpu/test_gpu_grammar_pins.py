"""The grammar backend a command asks for, at the version SGLang requires: the env layer's import chain of
`--grammar-backend xgrammar` (SGLang's default), `outlines` and `llguidance`, each with its module missing, at a
wrong version and at the right one. The probes run for real with a real python: an installed sglang 0.5.17 (its
dist-info with the wheel's Requires-Dist lines as recorded on the H200, and its backend modules, one import each)
and the backends' distributions as pip lays them out (dist-info plus package) on the service's PYTHONPATH; the
default's right xgrammar is this venv's own, a missing one a venv without it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gpu_data import load, venv_without

from pytest_dflash.config.loader import load_profile
from pytest_dflash.layers.gpu import env
from pytest_dflash.layers.gpu.chains import GRAMMAR_BACKENDS
from pytest_dflash.layers.gpu.layer import GpuHost
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun

SGLANG = ["{python}", "-m", "sglang.launch_server", "--model-path", "/models/target", "--port", "{port}"]
# sglang 0.5.17's own Requires-Dist on its grammar backends, as its wheel's METADATA says (recorded on the H200)
SGLANG_PINS = [line for line in load("h200/layers/packages.json")["requires"]["sglang"]
               if line.split("=")[0].split("<")[0] in ("xgrammar", "outlines", "llguidance")]
# the modules SGLang imports for each backend's chain (chains.py), each a module that imports the backend
BACKEND_MODULES = {"xgrammar": ["sglang/srt/server_args.py", "sglang/srt/function_call/function_call_parser.py",
                                "sglang/srt/constrained/xgrammar_backend.py"],
                   "outlines": ["sglang/srt/constrained/outlines_backend.py"],
                   "llguidance": ["sglang/srt/constrained/llguidance_backend.py"]}


def distribution(site: Path, name: str, version: str, *, requires: tuple[str, ...] = (),
                 module: str | None = None) -> None:
    """An installed distribution as pip lays it out: its dist-info and, where it has one, its package."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (info / "INSTALLER").write_text("pip\n", encoding="utf-8")
    if module:
        (site / module).mkdir()
        (site / module / "__init__.py").write_text(f"__version__ = {version!r}\n", encoding="utf-8")


def site_with(root: Path, backend: str, **installed: str) -> Path:
    """sglang 0.5.17, whose backend modules import `backend`'s, plus `installed` {distribution: version}."""
    site = root / "site"
    distribution(site, "sglang", "0.5.17", requires=tuple(SGLANG_PINS))
    for path in BACKEND_MODULES[backend]:
        module = site / path
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(f"import {backend}\n", encoding="utf-8")
    for package in {p.parent for path in BACKEND_MODULES[backend] for p in (site / path).parents
                    if p.is_relative_to(site / "sglang")}:  # fmt: skip
        (package / "__init__.py").touch()
    for name, version in installed.items():
        requires = ("outlines_core==0.1.26",) if name == "outlines" else ()
        distribution(site, name, version, requires=requires, module=name.replace("-", "_"))
    return site


def gpu_host(root: Path, site: Path, flags: list[str], *, python: str = sys.executable) -> GpuHost:
    path = root / "grammar.toml"
    path.write_text("\n".join([
        "[host]", 'connection = "local://"', f"python = {json.dumps(python)}", 'provision = "always"', "",
        "[services.dflash]", 'kind = "process"', 'algorithm = "DFLASH"', f"command = {json.dumps(SGLANG + flags)}",
        f"env = {{ PYTHONPATH = {json.dumps(str(site))} }}", 'ready_timeout = "60s"']) + "\n", encoding="utf-8")
    profile = load_profile(path)
    run = DflashRun({profile.name: profile}, RunOptions(provision=True, report_dir=root), "grammar")
    return GpuHost(run.host(profile.name))


def test_the_pins_are_sglang_0_5_17s() -> None:
    assert sorted(SGLANG_PINS) == ["llguidance<2.0.0,>=1.7.6", "outlines==0.1.11", "xgrammar==0.2.1"]
    assert sorted(p.requirement for b in GRAMMAR_BACKENDS.values() for p in b.pins if p.through == "sglang") == [
        "llguidance<2.0.0,>=1.7.6", "outlines==0.1.11", "xgrammar==0.2.1"]


@pytest.mark.parametrize(("backend", "installed", "line"), [
    ("outlines", {"outlines-core": "0.1.26"},
     "services dflash: --grammar-backend outlines: module outlines is not installed (no outlines distribution); "
     "sglang 0.5.17 requires outlines==0.1.11"),
    ("outlines", {"outlines": "0.1.10", "outlines-core": "0.1.26"},
     "services dflash: --grammar-backend outlines: module outlines is outlines 0.1.10; sglang 0.5.17 requires "
     "outlines==0.1.11"),
    ("outlines", {"outlines": "0.1.11", "outlines-core": "0.1.25"},
     "services dflash: --grammar-backend outlines: module outlines_core is outlines-core 0.1.25; outlines 0.1.11 "
     "requires outlines-core==0.1.26"),
    ("llguidance", {},
     "services dflash: --grammar-backend llguidance: module llguidance is not installed (no llguidance "
     "distribution); sglang 0.5.17 requires llguidance<2.0.0,>=1.7.6"),
    ("llguidance", {"llguidance": "2.0.1"},
     "services dflash: --grammar-backend llguidance: module llguidance is llguidance 2.0.1; sglang 0.5.17 "
     "requires llguidance<2.0.0,>=1.7.6"),
    ("xgrammar", {"xgrammar": "0.1.10"},
     "services dflash: --grammar-backend xgrammar: module xgrammar is xgrammar 0.1.10; sglang 0.5.17 requires "
     "xgrammar==0.2.1"),
], ids=["outlines-missing", "outlines-wrong", "outlines-core-wrong", "llguidance-missing", "llguidance-wrong",
        "xgrammar-wrong"])
def test_a_missing_or_wrong_backend_fails_in_one_line(tmp_path: Path, backend: str, installed: dict[str, str],
                                                      line: str) -> None:
    gpu = gpu_host(tmp_path, site_with(tmp_path, backend, **installed), ["--grammar-backend", backend])
    chain = GRAMMAR_BACKENDS[backend].chain
    with pytest.raises(AssertionError) as failed:
        env.import_chain(gpu, chain)
    assert line in str(failed.value).splitlines(), str(failed.value)
    imported = {c["name"]: c for c in gpu.cache["import_chain"]["chains"]}[chain]
    assert imported["ok"] is ("missing" not in line and "not installed" not in line)  # the probe really ran


def test_the_default_backend_without_xgrammar_fails_naming_the_default(tmp_path: Path) -> None:
    python = venv_without(tmp_path, "xgrammar")
    gpu = gpu_host(tmp_path, site_with(tmp_path, "xgrammar"), [], python=str(python))
    with pytest.raises(AssertionError) as failed:
        env.import_chain(gpu, "grammar")
    assert ("services dflash: no --grammar-backend (SGLang's default: xgrammar): module xgrammar is not installed "
            "(no xgrammar distribution); sglang 0.5.17 requires xgrammar==0.2.1") in str(failed.value).splitlines()
    assert "No module named 'xgrammar'" in str(failed.value)  # the import's failure is the evidence


@pytest.mark.parametrize(("backend", "installed"), [
    ("outlines", {"outlines": "0.1.11", "outlines-core": "0.1.26"}),
    ("llguidance", {"llguidance": "1.7.6"}),
    ("llguidance", {"llguidance": "1.9.0"}),
    ("xgrammar", {}),  # this venv's own xgrammar 0.2.1
], ids=["outlines", "llguidance-lowest", "llguidance", "xgrammar"])
def test_the_required_version_passes(tmp_path: Path, backend: str, installed: dict[str, str]) -> None:
    # The flag's spellings are read by chains.grammar_backends (test_gpu_chains.py); each probe here is a real
    # import in a fresh interpreter, so one spelling per backend, and xgrammar also as SGLang's default.
    for flags in ([f"--grammar-backend={backend}"], []) if backend == "xgrammar" else (["--grammar-backend", backend],):
        root = tmp_path / str(len(flags))
        gpu = gpu_host(root, site_with(root, backend, **installed), flags)
        env.import_chain(gpu, GRAMMAR_BACKENDS[backend].chain)
        versions = {name: info["version"] for name, info in gpu.cache["packages"]["distributions"].items()}
        expected = installed or {"xgrammar": "0.2.1"}
        assert {name: versions.get(name) for name in expected} == expected  # read from what is installed
