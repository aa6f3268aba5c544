"""What each service runs, as the GPU layers see it (pytest_dflash.layers.gpu.services): each service's manager
says how it is launched (`LaunchesOnHost`), the layers never ask for a kind. Nothing runs on a host here: the
live unit's `systemctl show` answer is a recorded-shape string."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.hostaccess.transport import CommandResult
from pytest_dflash.layers.gpu.layer import GpuHost
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun

SYSTEMD_PATH = ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
TEMPLATE = """[Unit]
Description=x {gpu}
[Service]
User=sglang
Environment="HF_HOME=/data/hf" CUDA_VISIBLE_DEVICES={gpu}
ExecStart={python} -m sglang.launch_server --port {port}
"""
PROFILE = """
[host]
connection = "local://"
python = "/venv/bin/python"
provision = "%s"

[services.sd]
kind = "systemd"
unit = "sd.service"
template = "u.service"
algorithm = "DFLASH"
port = 30001
gpus = [1]

[services.bare]
kind = "systemd"
unit = "bare.service"
algorithm = "NONE"
port = 30002

[services.pr]
kind = "process"
command = ["{python}", "-m", "pytest_dflash.refserver", "--port", "{port}"]
algorithm = "NONE"
env = { A = "1" }

[services.ct]
kind = "container"
image = "lmsysorg/sglang"
algorithm = "NONE"
port = 30003
env = { FLASHINFER_CUDA_ARCH_LIST = "9.0a" }

[services.ex]
kind = "external"
url = "http://127.0.0.1:9"
"""
SHOWN = ("LoadState=loaded\nExecStart={ path=/x/python ; argv[]=/x/python -m sglang.launch_server --port 30001 ; "
         "ignore_errors=no }\nEnvironment=A=1 B=2\nUser=svc\n")


def _gpu(tmp_path: Path, provision: str, monkeypatch: pytest.MonkeyPatch) -> GpuHost:
    (tmp_path / "u.service").write_text(TEMPLATE)
    (tmp_path / "h.toml").write_text(PROFILE % provision)
    profile = load_profile(tmp_path / "h.toml")
    host = DflashRun({profile.name: profile}, RunOptions(report_dir=tmp_path), "views").host(profile.name)

    def run(command: str, *args: str, **_: Any) -> CommandResult:
        assert provision == "never", "provisioning reads the template, not the host"
        loaded = args == ("sd.service",)  # bare.service is not installed
        return CommandResult(command % args, 0 if loaded else 1, SHOWN if loaded else "", "", 0.0)

    monkeypatch.setattr(host.transport, "run", run)
    return GpuHost(host)


def test_provisioning_each_service_is_seen_as_this_run_would_launch_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    views = {view.name: view for view in _gpu(tmp_path, "always", monkeypatch).views}
    assert set(views) == {"sd", "bare", "pr", "ct"}  # an external service has no launch environment
    sd = views["sd"]
    assert sd.argv == ("/venv/bin/python", "-m", "sglang.launch_server", "--port", "30001")
    assert dict(sd.env) == {"HF_HOME": "/data/hf", "CUDA_VISIBLE_DEVICES": "1", "PATH": SYSTEMD_PATH[1]}
    assert (sd.user, sd.source, sd.gpus) == ("sglang", "template u.service", (1,))
    bare = views["bare"]
    assert bare.argv == () and dict(bare.env) == dict([SYSTEMD_PATH])
    assert bare.source == "profile env only (unit not installed, no template)"
    pr = views["pr"]
    assert pr.argv == ("/venv/bin/python", "-m", "pytest_dflash.refserver", "--port", "{port}")
    assert dict(pr.env) == {"A": "1"} and pr.source == "profile command"
    assert views["ct"].argv == () and dict(views["ct"].env) == {"FLASHINFER_CUDA_ARCH_LIST": "9.0a"}
    assert [view.own_environment for view in views.values()] == [False, False, False, True]


def test_attached_a_systemd_service_is_seen_as_its_live_unit(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    views = {view.name: view for view in _gpu(tmp_path, "never", monkeypatch).views}
    sd = views["sd"]
    assert sd.argv == ("/x/python", "-m", "sglang.launch_server", "--port", "30001")
    assert dict(sd.env) == {"A": "1", "B": "2", "PATH": SYSTEMD_PATH[1]}
    assert (sd.user, sd.source) == ("svc", "live unit sd.service")
    assert views["bare"].source == "profile env only (unit not installed, no template)"


def test_a_service_with_its_own_environment_is_a_probe_group_of_its_own(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    groups = _gpu(tmp_path, "always", monkeypatch).groups
    assert [group.services for group in groups] == [("sd",), ("bare",), ("pr",), ("ct",)]
    assert groups[-1].env == {"FLASHINFER_CUDA_ARCH_LIST": "9.0a"}
