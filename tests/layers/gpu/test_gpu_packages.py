"""Requires-Dist consistency, pip check and env snapshots against the H200's real package set."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path

import pytest
from gpu_data import REPO, load

from pytest_dflash.layers.gpu.checks import (
    installed_versions,
    pip_check_issues,
    pip_conflicts,
    requirement_issues,
)
from pytest_dflash.layers.gpu.packages import (
    KERNEL_TORCH,
    check_requirements,
    diff,
    is_serving,
    kernel_torch_issue,
    normalize,
    parse_pip_check,
    read_baseline,
    snapshot,
    write_snapshots,
)

H200 = load("h200/layers/packages.json")
ABI_SPLIT = load("h200/faults/packages.json")
REQUIRERS = ["sglang", "sglang-kernel", "flashinfer-python", "torch", "xgrammar"]


def test_names_are_normalised_and_the_serving_stack_is_known() -> None:
    assert normalize("Flashinfer_Python") == "flashinfer-python"
    assert all(is_serving(n) for n in ("torch", "sglang-kernel", "nvidia-cuda-runtime", "nvidia-cudnn-cu13",
                                       "flashinfer-jit-cache", "xgrammar", "soundfile"))
    assert not any(is_serving(n) for n in ("numba", "timm", "nvidia-ml-py", "nvidia-cutlass-dsl"))


def test_the_staged_h200_stack_satisfies_every_serving_pin() -> None:
    issues = requirement_issues(H200, REQUIRERS)
    assert [i.describe() for i in issues if i.serving and i.installed is not None] == []
    mismatched = {i.name: i.installed for i in issues if i.installed is not None}
    assert mismatched == {"numba": "0.68.0", "timm": "1.0.29"}  # sglang pins them; the image has others
    missing = {i.name for i in issues if i.installed is None}
    assert {"torchao", "nvidia-cutlass-dsl"} <= missing and not any(is_serving(n) for n in missing)


def test_the_overlay_wins_over_the_shadowed_copy() -> None:
    assert installed_versions(H200)["transformers"] == "5.12.1"
    assert H200["shadowed"]["transformers"][0]["version"] == "5.17.0"


def test_a_kernel_built_for_another_torch_violates_its_pin() -> None:
    issues = requirement_issues(ABI_SPLIT, REQUIRERS)
    serving = [i.describe() for i in issues if i.serving and i.installed is not None]
    assert serving == ["sglang-kernel requires torch==2.13.0: torch 2.11.0 is installed"]


def test_markers_and_extras_are_honoured() -> None:
    env = H200["marker_env"]
    lines = ['av==16.1.0; sys_platform == "linux" and platform_machine == "aarch64"', 'rich>=13; extra == "b12x"',
             "torch==2.11.0", "soundfile==0.13.1"]
    assert check_requirements("sglang", lines, installed_versions(H200), env) == []
    broken = check_requirements("sglang", ["xgrammar==0.2.1"], {"xgrammar": "0.1.10"}, env)
    assert [(i.name, i.installed, i.kind) for i in broken] == [("xgrammar", "0.1.10", "mismatch")]


def test_pip_check_output_from_the_h200() -> None:
    issues, other = pip_check_issues(H200)
    assert other == []
    assert ("sglang", "numba==0.65.1", "0.68.0") in [(i.package, i.requirement, i.installed) for i in issues]
    missing = [i for i in issues if i.installed is None]
    assert len(missing) == 33 and all(not i.serving for i in missing)
    conflicts, notes = pip_conflicts(H200)
    assert conflicts == [] and len(notes) == 35


def test_pip_check_conflict_against_a_shadowed_copy_is_only_a_note() -> None:
    packages = copy.deepcopy(H200)
    packages["pip_check"]["stdout"] += ("sglang 0.5.17 has requirement transformers==5.12.1, but you have "
                                        "transformers 5.17.0.\n")
    conflicts, notes = pip_conflicts(packages)
    assert conflicts == [] and any("shadowed copy" in n for n in notes)
    packages["distributions"]["transformers"]["version"] = "5.17.0"
    conflicts, _ = pip_conflicts(packages)
    assert [c.requirement for c in conflicts] == ["transformers==5.12.1"]


def test_pip_check_parses_both_line_shapes() -> None:
    issues, other = parse_pip_check("torch 2.11.0 has requirement triton==3.6.0, but you have triton 3.5.1.\n"
                                    "sglang 0.5.17 requires soundfile, which is not installed.\n"
                                    "No broken requirements found.\nsomething else\n")
    assert [(i.package, i.requirement, i.installed, i.serving) for i in issues] == [
        ("torch", "triton==3.6.0", "3.5.1", True), ("sglang", "soundfile", None, True)]
    assert other == ["something else"]


def test_snapshot_roundtrip_and_drift(tmp_path: Path) -> None:
    recorded = load("h200/layers/env-snapshot.json")["hosts"]["h200"]
    current = snapshot(H200, driver="580.159.04", torch_cuda="13.0")
    assert current == recorded
    path = tmp_path / "good.json"
    write_snapshots(path, {"h200": current})
    assert read_baseline(path, "another-host") == current  # a single-host baseline applies to any host
    drifted = copy.deepcopy(current)
    drifted["packages"]["xgrammar"] = "0.1.10"
    drifted["packages"]["timm"] = "1.0.30"
    drifted["driver"] = "570.86.10"
    found = {d.name: (d.baseline, d.current, d.serving) for d in diff(current, drifted)}
    assert found == {"driver": ("580.159.04", "570.86.10", True), "xgrammar": ("0.2.1", "0.1.10", True),
                     "timm": ("1.0.29", "1.0.30", False)}
    assert diff(current, current) == []


def test_baseline_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"format": 1, "hosts": {"a": {}, "b": {}}}))
    with pytest.raises(ValueError, match="no snapshot for host 'c' \\(it has a, b\\)"):
        read_baseline(path, "c")
    path.write_text("{}")
    with pytest.raises(ValueError, match="not an env snapshot"):
        read_baseline(path, "c")
    path.write_text("[" * 100_000)  # a RecursionError before
    with pytest.raises(ValueError, match=f"^{path}: cannot read env snapshot: JSON nested too deep"):
        read_baseline(path, "c")


def test_kernel_torch_pairing() -> None:
    assert kernel_torch_issue({"sglang-kernel": "0.4.5", "torch": "2.11.0+cu130"}, []) is None
    issue = kernel_torch_issue({"sglang-kernel": "0.4.10", "torch": "2.13.0"}, [])
    assert issue is not None and issue.serving and issue.requirement.startswith("torch==2.14.*")
    assert kernel_torch_issue({"sglang-kernel": "0.4.10", "torch": "2.13.0"}, ["torch==2.14.1"]) is None  # its pin
    assert kernel_torch_issue({"sglang-kernel": "0.4.99", "torch": "2.13.0"}, []) is None  # a build not read
    assert kernel_torch_issue({"sglang-kernel": "0.4.5"}, []) is None  # no torch: the import chain says so


def test_kernel_torch_pairing_is_what_the_wheels_say() -> None:
    releases = tomllib.loads((REPO / "tests" / "data" / "sglang-versions" / "releases.toml").read_text())["release"]
    paired: dict[str, set[str]] = {}
    for release in releases:
        paired.setdefault(release["sglang_kernel"], set()).add(".".join(release["torch"].split(".")[:2]))
        assert release["version"] in KERNEL_TORCH[release["sglang_kernel"]][1], release
    assert {kernel: {torch} for kernel, (torch, _) in KERNEL_TORCH.items()} == paired
