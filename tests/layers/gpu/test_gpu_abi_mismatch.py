"""sglang 0.5.19 + sglang-kernel 0.4.6.post1 (built for torch 2.13) over torch 2.11.0: the env layer names the
package, the torch it was built for and the torch installed (issue 25 item 6), from recorded probes.

abi-local: the dry run here (real metadata, torch without its CUDA libraries); abi-h200: the device call, once
the lead has recorded it (skipped until then).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.layers.gpu.checks import (
    chain_failure,
    chain_result,
    installed_versions,
    requirement_issues,
)
from pytest_dflash.layers.gpu.layer import REQUIRERS
from pytest_dflash.layers.gpu.packages import kernel_torch_issue

DATA = Path(__file__).parents[2] / "data" / "sglang-versions"
RUNS = ["abi-local", "abi-h200"]


def probe(run: str, name: str) -> dict[str, Any]:
    path = DATA / run / f"{name}.json"
    if not path.is_file():
        pytest.skip(f"{path.relative_to(DATA)} not recorded yet (docs/sglang-versions.md)")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("run", RUNS)
def test_the_staged_stack_is_the_mismatch(run: str) -> None:
    """The probe saw sglang 0.5.19 and sglang-kernel 0.4.6.post1 from /tmp/abi-site over a torch 2.11."""
    packages = probe(run, "packages")
    installed = installed_versions(packages)
    assert installed["sglang"] == "0.5.19"
    assert installed["sglang-kernel"] == "0.4.6.post1"
    assert installed["torch"].startswith("2.11.")
    assert packages["distributions"]["sglang-kernel"]["location"] == "/tmp/abi-site"


@pytest.mark.parametrize("run", RUNS)
def test_env_layer_names_kernel_its_torch_and_the_installed_torch(run: str) -> None:
    """sglang-kernel 0.4.6.post1 names no torch itself; the pairing does: built for 2.13, 2.11 installed."""
    packages = probe(run, "packages")
    installed = installed_versions(packages)
    issue = kernel_torch_issue(installed, packages["requires"].get("sglang-kernel"))
    assert issue is not None
    assert issue.describe().startswith("sglang-kernel requires torch==2.13.* (built for the torch sglang 0.5.18 "
                                       "and 0.5.19 pin with it")
    assert issue.describe().endswith(f"torch {installed['torch']} is installed")
    described = [i.describe() for i in requirement_issues(packages, REQUIRERS) if i.serving and i.installed]
    assert f"sglang requires torch==2.13.0: torch {installed['torch']} is installed" in described


def test_h200_sgl_kernel_chain_fails_on_an_undefined_symbol() -> None:
    """On the H200 torch imports, so `import sgl_kernel` reaches the sm90 build and fails on a torch symbol."""
    result = chain_result(probe("abi-h200", "import_chain"), "sgl_kernel")
    assert result is not None
    failure = chain_failure(result)
    assert failure is not None
    assert "undefined symbol" in failure.error
    assert failure.package == "sglang-kernel"


def test_an_extension_that_cannot_load_names_its_package_not_its_bare_name() -> None:
    """The dry run's torch 2.11 without its CUDA libraries: `from torch._C import *` fails on libcudnn.so.9 and
    ImportError.name is '_C'; the package to fix is torch (not a package called '_C')."""
    failure = chain_failure(chain_result(probe("abi-local", "import_chain"), "sgl_kernel"))
    assert failure is not None and failure.package == "torch", failure
    assert "libcudnn.so.9" in failure.error
