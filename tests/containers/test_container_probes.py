"""The env layer's probes for a container service run inside its container (`exec`): the image's python, the
container's own env; host-wide probes (nvidia-smi inventory, kernel log) stay on the host; attach stays
read-only (audited)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from container_helpers import (
    GUEST_PYTHON,
    ULIMITS,
    containers_of,
    free_port,
    podman,
    refserver_command,
    remove,
    unique,
    write_profile,
)
from support.pytest_runs import assert_no_crash
from test_container_attach import READ_ONLY

ONLY_HERE = "dflash-container-only"  # a distribution only the container's env (PYTHONPATH) can see
EXEC = re.compile(r"printf %s [A-Za-z0-9+/=]+ \| base64 -d \| podman --runtime runc exec -i ([\w.-]+) (\S+) - .*",
                  re.S)


def _overlay(tmp_path: Path) -> Path:
    overlay = tmp_path / "overlay"
    info = overlay / f"{ONLY_HERE.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {ONLY_HERE}\nVersion: 1.0\n")
    return overlay


def _dump(directory: Path, host: str, key: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / host / f"{key}.json").read_text())
    return data


def test_env_probes_run_inside_the_attached_container(run_suite, refserver_image: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """suites/env attached to a container by label: packages / torch / import probes report the image's
    /opt/dflash-venv python and see a package only the container's PYTHONPATH holds; the audit log holds only
    reads, the probes as `podman exec` into that container, gpu_inventory on the host."""
    overlay = _overlay(tmp_path)
    name, port = unique("ct-probe"), free_port()
    root = Path(__file__).resolve().parents[2]
    podman("run", "-d", "--name", name, "--label", f"app={name}", *(f"--ulimit={u}" for u in ULIMITS),
           "-p", f"{port}:{port}", "-v", f"{root}:/opt/pytest-dflash:ro", "-v", f"{overlay}:/opt/overlay:ro",
           "--env", "PYTHONPATH=/opt/overlay", refserver_image,
           *[part.replace("{port}", str(port)) for part in refserver_command("DFLASH")], timeout=120)
    try:
        host = unique("ct-probes")
        profile = write_profile(tmp_path, host, refserver_image, provision="never", port=port,
                                extra=f'label = "app={name}"')
        log, dump = tmp_path / "commands.jsonl", tmp_path / "dump"
        monkeypatch.setenv("DFLASH_COMMAND_LOG", str(log))
        result = run_suite("env", "--host", str(profile), f"--dflash-probe-dump={dump}")
        assert_no_crash(result)
        text = result.stdout.str()
        assert "transport_error" not in text and "not running" not in text, text[-3000:]

        packages = _dump(dump, host, "packages")
        assert packages["python"] == GUEST_PYTHON, packages["python"]
        assert ONLY_HERE in packages["distributions"], sorted(packages["distributions"])
        assert packages["distributions"][ONLY_HERE]["location"] == "/opt/overlay"
        torch = _dump(dump, host, "torch_facts")
        assert torch["python"]["executable"] == GUEST_PYTHON, torch["python"]

        sent = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        assert sent and not [s for s in sent if s["mutating"]], sent
        assert all(s["read_only"] for s in sent)
        unknown = [s["command"] for s in sent if not any(p.fullmatch(str(s["command"])) for p in READ_ONLY)]
        assert unknown == [], unknown
        execs = [m for s in sent if (m := EXEC.fullmatch(str(s["command"])))]
        assert execs and {(m[1], m[2]) for m in execs} == {(name, GUEST_PYTHON)}, execs
        on_host = [s for s in sent if str(s["command"]).startswith("printf %s") and not EXEC.fullmatch(s["command"])]
        assert on_host, "gpu_inventory / kernel_log should run on the host"
        assert podman("container", "inspect", "--format", "{{.State.Status}}", name).stdout.strip() == "running"
    finally:
        remove(name)


def test_env_probes_run_in_the_image_before_provisioning(run_suite, refserver_image: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """--provision, nothing started yet (the env layer starts nothing): the probes run in a throwaway
    `run --rm -i` of the service's image with its env and mounts (the image's python, its PYTHONPATH), labelled
    like the service; nothing is left behind."""
    overlay = _overlay(tmp_path)
    host = unique("ct-probes-prov")
    profile = write_profile(tmp_path, host, refserver_image, extra='env = { PYTHONPATH = "/opt/overlay" }')
    root = Path(__file__).resolve().parents[2]
    mounts = json.dumps([f"{root}:/opt/pytest-dflash:ro"])
    profile.write_text(profile.read_text().replace(mounts, json.dumps([f"{root}:/opt/pytest-dflash:ro",
                                                                       f"{overlay}:/opt/overlay:ro"])))
    log, dump = tmp_path / "commands.jsonl", tmp_path / "dump"
    monkeypatch.setenv("DFLASH_COMMAND_LOG", str(log))
    result = run_suite("env", "--host", str(profile), f"--dflash-probe-dump={dump}")
    assert_no_crash(result)
    assert "transport_error" not in result.stdout.str(), result.stdout.str()[-3000:]
    packages = _dump(dump, host, "packages")
    assert packages["python"] == GUEST_PYTHON, packages["python"]
    assert packages["distributions"].get(ONLY_HERE, {}).get("location") == "/opt/overlay", packages["distributions"]
    sent = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    throwaway = [s["command"] for s in sent if "probe in a throwaway container" in str(s["command"])]
    assert throwaway and all(s["mutating"] for s in sent if s["command"] in throwaway), sent
    assert containers_of(host) == []
