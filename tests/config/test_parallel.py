"""Multi-GPU services in a profile (pytest_dflash.config.parallel): the GPUs a command's --tp-size / --dp-size /
--pp-size need, checked against the service's `gpus` and CUDA_VISIBLE_DEVICES before anything starts, and the
`gpus` list driving CUDA_VISIBLE_DEVICES of the server a run starts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.config.parallel import (
    LayoutError,
    gpu_environment,
    gpus_disagree,
    parse_layout,
    visible_devices,
    visible_disagree,
)
from pytest_dflash.errors import InventoryError, ServiceError
from pytest_dflash.layers.gpu.parallel import layout_problems
from pytest_dflash.layers.gpu.services import ServiceView
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun


@pytest.mark.parametrize(("argv", "ranks", "needed"), [
    (["-m", "sglang.launch_server"], 1, 1),
    (["--tp-size", "4"], 4, 4),
    (["--tp=2"], 2, 2),
    (["--tensor-parallel-size", "2", "--dp-size", "2"], 4, 4),  # DP copies of a TP2 engine
    (["--tp", "4", "--dp", "2", "--enable-dp-attention"], 4, 4),  # DP attention shares the TP GPUs
    (["--tp-size", "2", "--pp-size", "2"], 4, 4),
    (["--tp", "8", "--nnodes", "2"], 4, 4),  # half the ranks on each of two hosts
    (["--tp-size", "2", "--base-gpu-id", "2"], 2, 4),  # ranks on visible GPUs 2 and 3
    (["--tp-size", "2", "--gpu-id-step", "2"], 2, 3),  # ranks on visible GPUs 0 and 2
])
def test_the_gpus_a_command_needs(argv: list[str], ranks: int, needed: int) -> None:
    layout = parse_layout(["python", "-m", "sglang.launch_server", "--port", "30000", *argv])
    assert (layout.ranks, layout.gpus_needed) == (ranks, needed)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tp-size", "x"], "--tp-size 'x' is not an integer"),
    (["--tp-size", "0"], "--tp-size 0 is below 1"),
    (["--tp-size"], "--tp-size '' is not an integer"),
    (["--tp", "4", "--dp", "3", "--enable-dp-attention"], "--dp-size 3 to divide --tp-size 4"),
])
def test_a_bad_size_is_named(argv: list[str], message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        parse_layout(argv)


def test_gpus_against_the_layout_and_the_environment() -> None:
    tp4 = parse_layout(["--tp-size", "4"])
    assert gpus_disagree(tp4, [4, 5, 6, 7]) is None and gpus_disagree(tp4, []) is None
    assert gpus_disagree(tp4, [4, 5]) == ("gpus [4, 5] lists 2 GPU(s) but the command's --tp-size 4 (4 rank(s) on "
                                          "this host) uses 4")
    assert gpus_disagree(parse_layout(["/opt/start-server.sh"]), [0, 1]) is None  # its flags are in the script
    assert gpus_disagree(parse_layout(["sglang", "serve"]), [0, 1]) == ("gpus [0, 1] lists 2 GPU(s) but the command's no "
                                                       "--tp-size/--dp-size/--pp-size (1 GPU) uses 1")
    assert gpus_disagree(parse_layout(["--tp", "2"]), [3, 3]) == "gpus [3, 3] names a GPU twice"
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "4,5"}) == (4, 5)
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-1b2c"}) is None and visible_devices({}) is None
    assert visible_disagree([4, 5], (4, 5)) is None
    assert "CUDA_VISIBLE_DEVICES=4 but gpus [4, 5]" in (visible_disagree([4, 5], (4,)) or "")
    assert gpu_environment([4, 5, 6, 7]) == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"} and gpu_environment([]) == {}


PROFILE = """
[host]
connection = "local://"

[services.tp]
kind = "process"
algorithm = "NONE"
command = ["{python}", "-m", "sglang.launch_server", "--port", "{port}", %s]
%s
"""


def _load(tmp_path: Path, flags: str, extra: str) -> None:
    (tmp_path / "h.toml").write_text(PROFILE % (flags, extra))
    load_profile(tmp_path / "h.toml")


@pytest.mark.parametrize(("flags", "extra", "message"), [
    ('"--tp-size", "4"', "gpus = [4, 5]", r"services\.tp\.gpus: gpus \[4, 5\] lists 2 GPU\(s\) but the command's "
                                          r"--tp-size 4"),
    ('"--tp-size", "2"', "gpus = [1, 1]", r"names a GPU twice"),
    ('"--tp-size", "two"', "gpus = [0, 1]", r"services\.tp\.command: --tp-size 'two' is not an integer"),
    ('"--tp-size", "{tp}"', 'gpus = [0, 1]\nvars = { tp = "4" }', r"lists 2 GPU\(s\) but the command's --tp-size 4"),
    ('"--tp-size", "2"', 'gpus = [0, 1]\nenv = { CUDA_VISIBLE_DEVICES = "0" }',
     r"CUDA_VISIBLE_DEVICES=0 but gpus \[0, 1\]"),
])
def test_a_profile_whose_gpus_disagree_with_its_command_is_refused(tmp_path: Path, flags: str, extra: str,
                                                                   message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        _load(tmp_path, flags, extra)


@pytest.mark.parametrize(("flags", "extra"), [
    ('"--tp-size", "2"', "gpus = [4, 5]"),
    ('"--tp-size", "{tp}"', 'gpus = [0, 1]\nvars = { tp = "2" }'),
    ('"--tp-size", "{tp}"', "gpus = [0, 1]"),  # filled in on the host: the env layer checks the launch
    ('"--tp-size", "2"', ""),  # no gpus: the profile says nothing to compare
])
def test_a_profile_whose_gpus_agree_loads(tmp_path: Path, flags: str, extra: str) -> None:
    _load(tmp_path, flags, extra)


def test_a_started_process_sees_its_gpus_as_cuda_visible_devices(tmp_path: Path) -> None:
    """The `gpus` list is the server's CUDA_VISIBLE_DEVICES, in its order, whatever the run's own environment."""
    script = "import os, time; print('CVD=' + os.environ.get('CUDA_VISIBLE_DEVICES', '-'), flush=True); time.sleep(30)"
    (tmp_path / "h.toml").write_text(f"""
[host]
connection = "local://"
[services.tp]
kind = "process"
algorithm = "NONE"
url = "http://127.0.0.1:9"
command = [{sys.executable!r}, "-c", {script!r}]
gpus = [6, 2]
""")
    profile = load_profile(tmp_path / "h.toml")
    host = DflashRun({profile.name: profile}, RunOptions(report_dir=tmp_path), "cvd").host(profile.name)
    manager = host.service("tp").manager
    manager.start()
    try:
        deadline = time.monotonic() + 20
        while "CVD=" not in (log := manager.log_path.read_text()) and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.1)
        assert "CVD=6,2" in log
        assert manager.launch_environment(live=True).env["CUDA_VISIBLE_DEVICES"] == "6,2"  # type: ignore[attr-defined]
    finally:
        manager.stop()


UNIT = """[Unit]
Description=x
[Service]
%sExecStart={python} -m sglang.launch_server --port {port} --tp-size 4
"""


@pytest.mark.parametrize(("line", "expected"), [
    ("", "Environment=CUDA_VISIBLE_DEVICES=4,5,6,7\n"),  # added where the template sets none
    ("Environment=CUDA_VISIBLE_DEVICES={gpus}\n", "Environment=CUDA_VISIBLE_DEVICES=4,5,6,7\n"),
    ("Environment=CUDA_VISIBLE_DEVICES={gpu}\n", "CUDA_VISIBLE_DEVICES=4 but gpus [4, 5, 6, 7]"),
])
def test_a_provisioned_unit_runs_on_the_profiles_gpus(tmp_path: Path, line: str, expected: str) -> None:
    (tmp_path / "u.service").write_text(UNIT % line)
    (tmp_path / "h.toml").write_text("""
[host]
connection = "local://"
provision = "always"
[services.sd]
kind = "systemd"
unit = "sd.service"
template = "u.service"
algorithm = "NONE"
port = 30001
gpus = [4, 5, 6, 7]
""")
    profile = load_profile(tmp_path / "h.toml")
    host = DflashRun({profile.name: profile}, RunOptions(report_dir=tmp_path), "unit").host(profile.name)
    manager = host.service("sd").manager
    if expected.startswith("Environment="):
        assert manager.render_unit().count(expected) == 1  # type: ignore[attr-defined]
    else:
        with pytest.raises(ServiceError, match=expected.replace("[", r"\[").replace("]", r"\]")):
            manager.render_unit()  # type: ignore[attr-defined]


def _view(argv: tuple[str, ...], gpus: tuple[int, ...] = (), **env: str) -> ServiceView:
    return ServiceView("tp", argv, env, None, "live unit tp.service", gpus)


def test_the_env_layer_reads_the_launch_as_the_host_has_it() -> None:
    """A unit known only on the host (attach mode) is judged from its ExecStart and Environment."""
    tp4 = ("/venv/bin/python", "-m", "sglang.launch_server", "--tp-size", "4")
    line, problems = layout_problems(_view(tp4, (4, 5, 6, 7), CUDA_VISIBLE_DEVICES="4,5,6,7"))
    assert problems == [] and line == "tp: --tp-size 4 (4 rank(s) on this host) on GPUs 4,5,6,7"
    _, problems = layout_problems(_view(tp4, (), CUDA_VISIBLE_DEVICES="4"))
    assert problems == ["tp (live unit tp.service): CUDA_VISIBLE_DEVICES=4 shows 1 GPU(s) but the command's "
                        "--tp-size 4 (4 rank(s) on this host) needs 4"]
    _, problems = layout_problems(_view(tp4, (4, 5), CUDA_VISIBLE_DEVICES="4,5"))
    assert len(problems) == 1 and "gpus [4, 5] lists 2 GPU(s)" in problems[0]
    _, problems = layout_problems(_view((*tp4[:-1], "four")))
    assert problems == ["tp (live unit tp.service): --tp-size 'four' is not an integer"]
