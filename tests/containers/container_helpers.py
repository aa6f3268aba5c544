"""Profiles of refserver containers and what the tests read back from podman."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = ROOT / "suites"
GUEST_PYTHON = "/opt/dflash-venv/bin/python"
ULIMITS = ["nofile=1024:1024", "nproc=1024:1024"]
PODMAN = ["podman", "--runtime", "runc"]


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} exited {result.returncode}: {result.stderr.strip()[-500:]}")
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def refserver_command(algorithm: str, args: Sequence[str] = ()) -> list[str]:
    # the guest venv has no xgrammar (tests/testhost/build.sh): its refservers say --grammar-backend none, as
    # the test host's units do, and their profiles structured_output = false (write_profile)
    return [GUEST_PYTHON, "-m", "pytest_dflash.refserver", "--host", "0.0.0.0", "--port", "{port}",
            "--speculative-algorithm", algorithm, "--speculative-num-draft-tokens", "8", "--grammar-backend", "none",
            *args]


def write_profile(directory: Path, host: str, image: str, *, algorithm: str = "DFLASH", args: Sequence[str] = (),
                  command: Sequence[str] | None = None, provision: str = "always", extra: str = "",
                  port: int | None = None) -> Path:
    """A local profile with one container service `dflash` running the refserver from `image`."""
    lines = ["[host]", 'connection = "local://"', f'python = "{sys.executable}"', f'provision = "{provision}"', "",
             "[services.dflash]", 'kind = "container"', 'engine = "podman"', 'runtime = "runc"',
             f"ulimits = {json.dumps(ULIMITS)}", f'image = "{image}"', f'algorithm = "{algorithm}"',
             f"port = {port or free_port()}", f"mounts = {json.dumps([f'{ROOT}:/opt/pytest-dflash:ro'])}",
             f"command = {json.dumps(list(command) if command is not None else refserver_command(algorithm, args))}",
             'ready_timeout = "90s"', 'stop_timeout = "5s"', "structured_output = false", extra, ""]
    path = directory / f"{host}.toml"
    path.write_text("\n".join(lines))
    return path


def containers_of(host: str) -> list[str]:
    """Containers this tool created for host profile `host` (by label), running or not."""
    out = podman("ps", "-a", "--filter", f"label=pytest-dflash.host={host}", "--format", "{{.Names}}").stdout
    return out.split()


def remove(*names: str) -> None:
    for name in names:
        podman("rm", "-f", "-t", "0", name, check=False)


__all__ = ["PODMAN", "containers_of", "free_port", "refserver_command", "remove", "unique", "write_profile"]
