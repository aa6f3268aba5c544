"""Helpers for the end-to-end self-tests: profiles of refserver services, verdict reading."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).parents[2]
SUITES = ROOT / "suites"
ARGS = {"NONE": [], "DFLASH": ["--speculative-num-draft-tokens", "8"],
        "DDTREE": ["--speculative-num-draft-tokens", "8", "--speculative-ddtree-budget", "32"]}


def toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def write_profile(
    directory: Path,
    name: str,
    services: Mapping[str, tuple[str, Sequence[str]]],
    *,
    parity: tuple[str, Sequence[str]] | None = None,
    extra: str = "",
    service_extra: Mapping[str, str] | None = None,
) -> Path:
    """A local profile whose services are refservers: {service: (ALGORITHM, extra refserver args)}."""
    lines = ["[host]", 'connection = "local://"', f'python = "{sys.executable}"', 'provision = "always"', ""]
    for service, (algorithm, args) in services.items():
        command = ["{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
                   "--speculative-algorithm", algorithm, "--enable-metrics", *ARGS.get(algorithm, []), *args]
        lines += [f"[services.{service}]", 'kind = "process"', f'algorithm = "{algorithm}"',
                  f"command = {toml_list(command)}", 'ready_timeout = "60s"',
                  (service_extra or {}).get(service, ""), ""]
    if parity:
        reference, compared = parity
        lines += ["[parity]", f'reference = "{reference}"', f"compare = {toml_list(compared)}",
                  f'plain = "{reference}"', ""]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + extra)
    return path
