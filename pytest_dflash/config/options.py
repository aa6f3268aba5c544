"""Options: the core flags of the plugin and the helpers every layer module uses for its own.

Each option is a command-line flag and an ini key of the same name (dflash_ prefix); the command line wins.
Values are parsed here, at the edge, and a bad one is a `pytest.UsageError` that names flag and ini key.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.durations import parse_seconds
from pytest_dflash.run.layers import LAYERS

Option = tuple[str, str, str]  # (flag, dest = ini key, help)


def add_text_options(parser: pytest.Parser, options: Sequence[Option]) -> None:
    """Register each (flag, dest, help) as a flag with a metavar from its last word and an ini key `dest`."""
    group = parser.getgroup("dflash")
    for flag, dest, text in options:
        group.addoption(flag, dest=dest, default=None, metavar=flag.rsplit("-", 1)[-1].upper(), help=text)
        parser.addini(dest, text, default="")


def option_text(config: pytest.Config, dest: str) -> str:
    """The option's value as stripped text: the command line, else the ini key, else ''."""
    value = config.getoption(dest)
    if value is None:
        value = config.getini(dest)
    return str(value or "").strip()


def option_source(options: Sequence[Option], dest: str) -> str:
    """'--flag / ini_key', for messages that say where a bad value came from."""
    flag = next(f for f, d, _ in options if d == dest)
    return f"{flag} / {dest}"


# ---- the core options ----------------------------------------------------------------------------------

HOST_HELP = ("host profile to test: a name looked up in --hosts-dir (or the built-in 'local'), "
             "or a path to a .toml file; repeatable")
ATTACH_HELP = "attach to an already running OpenAI-compatible server at URL (no host access); repeatable"
PROVISION_HELP = ("deploy and start the profile's services (systemd units / processes) and remove them afterwards; "
                  "default: attach to the services already running")
KEEP_HELP = "leave provisioned services running after the run (for debugging)"
JOURNAL_LINES_HELP = "lines of service log / journal attached to each failure (default 200)"
HOSTS_DIR_HELP = "directory of host profiles (default: ./hosts)"
REPORT_HELP = "directory for verdict JSON files (default: reports)"
READY_TIMEOUT_HELP = "override every service's readiness budget (e.g. 90s, 15m)"
GATE_HELP = ("comma-separated layers that must pass on every host for exit code 0, e.g. "
             "'host,service,generation,parity' (see docs/gating.md)")
LOCK_WAIT_HELP = "how long to wait for another run's host lock before failing (default 10m)"
FLEET_HELP = ("test every host of a fleet: a folder of *.toml profiles, or an Ansible-style YAML/INI inventory "
              "FILE[:GROUP] whose hosts name a base profile in their dflash_profile var")
SHARD_HELP = "run only shard I of N of the hosts (1-based, deterministic by host name), e.g. --shard 2/8"
REQUEST_TIMEOUT_HELP = "timeout of one HTTP request made by a test (default 60s; readiness has its own budgets)"


def add_core_options(parser: pytest.Parser) -> None:
    """The plugin's own flags and ini keys (the layer modules add theirs through `add_text_options`)."""
    group = parser.getgroup("dflash", "pytest-dflash: DFlash / DDTree inference host acceptance")
    group.addoption("--host", action="append", dest="dflash_hosts", default=None, metavar="NAME|PATH",
                    help=HOST_HELP)
    group.addoption("--attach", action="append", dest="dflash_attach", default=None, metavar="URL",
                    help=ATTACH_HELP)
    group.addoption("--provision", action="store_true", dest="dflash_provision", default=None,
                    help=PROVISION_HELP)
    group.addoption("--keep", action="store_true", dest="dflash_keep", default=None, help=KEEP_HELP)
    group.addoption("--journal-lines", dest="dflash_journal_lines", default=None, metavar="N",
                    help=JOURNAL_LINES_HELP)
    group.addoption("--hosts-dir", dest="dflash_hosts_dir", default=None, metavar="DIR", help=HOSTS_DIR_HELP)
    group.addoption("--dflash-report", dest="dflash_report", default=None, metavar="DIR", help=REPORT_HELP)
    group.addoption("--ready-timeout", dest="dflash_ready_timeout", default=None, metavar="DURATION",
                    help=READY_TIMEOUT_HELP)
    group.addoption("--gate", dest="dflash_gate", default=None, metavar="LAYERS", help=GATE_HELP)
    group.addoption("--lock-wait", dest="dflash_lock_wait", default=None, metavar="DURATION", help=LOCK_WAIT_HELP)
    group.addoption("--request-timeout", dest="dflash_request_timeout", default=None, metavar="DURATION",
                    help=REQUEST_TIMEOUT_HELP)
    group.addoption("--fleet", action="append", dest="dflash_fleet", default=None, metavar="DIR|FILE[:GROUP]",
                    help=FLEET_HELP)
    group.addoption("--shard", dest="dflash_shard", default=None, metavar="I/N", help=SHARD_HELP)
    parser.addini("dflash_hosts", HOST_HELP, type="linelist", default=[])
    parser.addini("dflash_attach", ATTACH_HELP, type="linelist", default=[])
    parser.addini("dflash_provision", PROVISION_HELP, type="bool", default=False)
    parser.addini("dflash_keep", KEEP_HELP, type="bool", default=False)
    parser.addini("dflash_journal_lines", JOURNAL_LINES_HELP, default="200")
    parser.addini("dflash_hosts_dir", HOSTS_DIR_HELP, default="hosts")
    parser.addini("dflash_report", REPORT_HELP, default="reports")
    parser.addini("dflash_ready_timeout", READY_TIMEOUT_HELP, default="")
    parser.addini("dflash_gate", GATE_HELP, default="")
    parser.addini("dflash_lock_wait", LOCK_WAIT_HELP, default="10m")
    parser.addini("dflash_request_timeout", REQUEST_TIMEOUT_HELP, default="60s")
    parser.addini("dflash_fleet", FLEET_HELP, type="linelist", default=[])
    parser.addini("dflash_shard", SHARD_HELP, default="")


def option(config: pytest.Config, name: str) -> Any:
    """Command line first, then the ini key of the same name."""
    value = config.getoption(name)
    if value is None or value == []:
        value = config.getini(name)
    return value


def int_option(config: pytest.Config, name: str, flag: str) -> int:
    raw = option(config, name)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{flag} / {name}: {raw!r} is not an integer") from None
    if value < 0:
        raise pytest.UsageError(f"{flag} / {name}: {raw!r} must not be negative")
    return value


def duration_option(config: pytest.Config, name: str, flag: str) -> float | None:
    raw = option(config, name)
    if raw in (None, ""):
        return None
    try:
        return parse_seconds(str(raw), where=f"{flag} / {name}")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def gate_layers(config: pytest.Config) -> list[str]:
    raw = str(option(config, "dflash_gate") or "")
    layers = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown:
        raise pytest.UsageError(f"--gate / dflash_gate: unknown layer {unknown[0]!r} (layers: {', '.join(LAYERS)})")
    return layers


def report_dir(config: pytest.Config) -> Path:
    path = Path(str(option(config, "dflash_report")))
    return path if path.is_absolute() else config.invocation_params.dir / path
