"""Flags a later SGLang release removed: the table (against the wheels' read in tests/data/sglang-versions/) and
the env check, with the packages probe run for real on an sglang distribution installed on disk (its dist-info)."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest
from gpu_data import REPO, SUITES
from support.pytest_runs import verdict

from pytest_dflash.config.loader import load_profile
from pytest_dflash.layers.gpu import env
from pytest_dflash.layers.gpu.flags import (
    HELP_TEXT_REPLACEMENTS,
    NEWEST_READ,
    REMOVED_FLAGS,
    command_flags,
    flag_findings,
)
from pytest_dflash.layers.gpu.layer import GpuHost
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun

RELEASES = tomllib.loads((REPO / "tests" / "data" / "sglang-versions" / "releases.toml").read_text(encoding="utf-8"))
SGLANG = ["{python}", "-m", "sglang.launch_server", "--model-path", "/models/target", "--port", "{port}",
          "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/draft"]
WINDOW = ["--speculative-dflash-draft-window-size", "512"]


def test_the_table_is_what_the_wheels_say() -> None:
    read = {r["flag"]: r for r in RELEASES["removed_flag"]}
    assert [r.flag for r in REMOVED_FLAGS] == list(read)
    for flag in REMOVED_FLAGS:
        wheel = read[flag.flag]
        assert (flag.removed_in, flag.source, flag.deprecated) == (wheel["removed_in"], wheel["source"],
                                                                   wheel["deprecated_in_last"]), flag.flag
        if flag.flag in HELP_TEXT_REPLACEMENTS:  # named only by the help text of the last release that had it
            assert wheel["replacement"] == "" and flag.replacement, flag.flag
        else:
            assert flag.replacement == (wheel["replacement"] or None), flag.flag
    assert RELEASES["release"][-1]["version"] == NEWEST_READ


@pytest.mark.parametrize(("installed", "gone", "text"), [
    ("0.5.17", False, "goes away in sglang 0.5.20 (installed: 0.5.17, which still takes it); use "
                      "--speculative-draft-window-size"),
    ("0.5.19", False, "goes away in sglang 0.5.20 (installed: 0.5.19, which still takes it)"),
    ("0.5.20", True, "was removed in sglang 0.5.20 (installed: 0.5.20; last in 0.5.19: sglang/srt/server_args.py:3911)"
                     "; use --speculative-draft-window-size"),
    ("0.5.23.post1", True, "was removed in sglang 0.5.20 (installed: 0.5.23.post1"),
    ("0.5.24.dev3+g1234", True, "use --speculative-draft-window-size"),  # removals stay removed
])
def test_the_window_flag_by_release(installed: str, gone: bool, text: str) -> None:
    (finding,) = flag_findings("dflash", [*SGLANG, *WINDOW], installed)
    assert finding.gone is gone and text in finding.describe(), finding.describe()


def test_flags_it_does_not_judge() -> None:
    assert flag_findings("dflash", [*SGLANG, *WINDOW], "not-a-version") == []
    refserver = ["{python}", "-m", "pytest_dflash.refserver", *SGLANG[3:], *WINDOW]
    assert flag_findings("dflash", refserver, "0.5.23") == []  # the refserver takes 0.5.17's flags
    overlay = [*SGLANG, "--speculative-ddtree-budget", "32", "--disable-cuda-graph"]  # never removed (0.5.23 warns)
    assert flag_findings("ddtree", overlay, "0.5.23") == []


def test_a_flag_written_with_equals_and_sglang_serve() -> None:
    argv = ["/venv/bin/sglang", "serve", "--model-path", "/m", "--cuda-graph-max-bs=16", "--stream-output"]
    assert command_flags(argv) == ["--model-path", "--cuda-graph-max-bs", "--stream-output"]
    found = [f.describe() for f in flag_findings("plain", argv, "0.5.21")]
    assert found == [
        "service plain: --cuda-graph-max-bs was removed in sglang 0.5.20 (installed: 0.5.21; last in 0.5.19: "
        "sglang/srt/server_args.py:3928); use --cuda-graph-max-bs-decode",
        "service plain: --stream-output was removed in sglang 0.5.20 (installed: 0.5.21; last in 0.5.19: "
        "sglang/srt/server_args.py:3854); use --incremental-streaming-output"]


def test_a_replacement_removed_later_is_not_recommended() -> None:
    argv = [*SGLANG, "--piecewise-cuda-graph-compiler", "inductor"]
    (on_21,) = flag_findings("dflash", argv, "0.5.21")
    assert on_21.describe().endswith("; use --cuda-graph-tc-compiler")
    (on_23,) = flag_findings("dflash", argv, "0.5.23")
    assert on_23.describe().endswith("; its replacement --cuda-graph-tc-compiler was removed too (in sglang 0.5.22): "
                                     "drop it")


# ---- the env check, its packages probe run for real ---------------------------------------------------------


def installed_sglang(root: Path, version: str) -> Path:
    """A site directory holding an installed sglang distribution of `version`: its dist-info, as pip writes it
    (importlib.metadata and the packages probe read it; there is no code to import)."""
    site = root / f"site-{version}"
    info = site / f"sglang-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.4\nName: sglang\nVersion: {version}\n", encoding="utf-8")
    (info / "INSTALLER").write_text("pip\n", encoding="utf-8")
    return site


def write_profile(directory: Path, name: str, site: Path, command: list[str]) -> Path:
    path = directory / f"{name}.toml"
    path.write_text("\n".join([
        "[host]", 'connection = "local://"', f"python = {json.dumps(sys.executable)}", 'provision = "always"', "",
        "[services.dflash]", 'kind = "process"', 'algorithm = "DFLASH"', f"command = {json.dumps(command)}",
        f"env = {{ PYTHONPATH = {json.dumps(str(site))} }}", 'ready_timeout = "60s"']) + "\n", encoding="utf-8")
    return path


def gpu_host(profile: Path, tmp_path: Path) -> GpuHost:
    host_profile = load_profile(profile)
    run = DflashRun({host_profile.name: host_profile}, RunOptions(provision=True, report_dir=tmp_path), "flags")
    return GpuHost(run.host(host_profile.name))


def test_a_removed_flag_fails_the_env_layer_naming_its_replacement(tmp_path: Path) -> None:
    site = installed_sglang(tmp_path, "0.5.23")
    gpu = gpu_host(write_profile(tmp_path, "new", site, [*SGLANG, *WINDOW]), tmp_path)
    with pytest.raises(AssertionError, match=r"\[sglang-flag-removed\]") as failed:
        env.service_flags_exist_in_installed_sglang(gpu)
    message = str(failed.value)
    assert "services dflash pass flags sglang 0.5.23 no longer has" in message
    assert ("service dflash: --speculative-dflash-draft-window-size was removed in sglang 0.5.20 (installed: 0.5.23; "
            "last in 0.5.19: sglang/srt/server_args.py:3911); use --speculative-draft-window-size") in message
    assert gpu.cache["packages"]["distributions"]["sglang"]["location"] == str(site)  # the probe really read it


def test_the_same_profile_passes_on_the_release_it_was_written_for(tmp_path: Path) -> None:
    site = installed_sglang(tmp_path, "0.5.17")
    gpu = gpu_host(write_profile(tmp_path, "old", site, [*SGLANG, *WINDOW]), tmp_path)
    with pytest.warns(env.EnvWarning, match=r"--speculative-dflash-draft-window-size goes away in sglang 0.5.20 "
                                            r"\(installed: 0.5.17, which still takes it\); use "
                                            "--speculative-draft-window-size"):
        env.service_flags_exist_in_installed_sglang(gpu)
    assert gpu.host.facts.export["sglang_flags_checked"].startswith("dflash: sglang 0.5.17")
    renamed = gpu_host(write_profile(tmp_path, "renamed", installed_sglang(tmp_path, "0.5.23"),
                                     [*SGLANG, "--speculative-draft-window-size", "512"]), tmp_path)
    env.service_flags_exist_in_installed_sglang(renamed)  # the replacement passes on the new release


def test_nothing_to_judge_is_a_skip(tmp_path: Path) -> None:
    refserver = ["{python}", "-m", "pytest_dflash.refserver", "--port", "{port}", *WINDOW]
    gpu = gpu_host(write_profile(tmp_path, "ref", installed_sglang(tmp_path, "0.5.23"), refserver), tmp_path)
    with pytest.raises(pytest.skip.Exception, match="no service of ref runs sglang with a command to read"):
        env.service_flags_exist_in_installed_sglang(gpu)


def test_the_env_suite_stops_the_profile_before_its_server_starts(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """suites/env, for real: the flag check fails naming the replacement; nothing was started."""
    site = installed_sglang(tmp_path, "0.5.23")
    profile = write_profile(tmp_path, "newsglang", site, [*SGLANG, *WINDOW])
    result = pytester.runpytest_subprocess(str(SUITES / "env"), "-p", "no:cacheprovider", "-rA", "-k",
                                           "service_flags", f"--dflash-report={tmp_path / 'r'}", "--host",
                                           str(profile))
    result.stdout.fnmatch_lines(["*FAILED*test_service_flags_exist_in_installed_sglang*[[]sglang-flag-removed[]]*"])
    assert "use --speculative-draft-window-size" in result.stdout.str()
    assert verdict(tmp_path / "r", "newsglang")["layers"]["env"]["outcome"] == "failed"
    assert "started (http" not in result.stdout.str()
