"""Reading a host profile: the file, the whole document validated table by table, and the one-line errors.

A profile is validated completely at load time. Every problem becomes one `InventoryError` that names the
file, the dotted key and what was expected, e.g.

    hosts/ct200.toml: services.dflash.url: expected an http(s) URL, got 'htp:/x'

Each table has its validator under config/tables/ ([host], [services.*], [parity], [floors.*], [perf]), which
config/schema.py and `pytest-dflash check` follow; tests/config/test_schema.py holds the two in step.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import tomllib
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_dflash.config.profiles import AUTO, HostProfile, ServiceSpec
from pytest_dflash.config.tables.floors import parse_floors
from pytest_dflash.config.tables.host import PROVISION_MODES, become_user, check_connection, host_name
from pytest_dflash.config.tables.parity import parse_parity
from pytest_dflash.config.tables.perf import parse_perf
from pytest_dflash.config.tables.reader import Table
from pytest_dflash.config.tables.services import check_url, parse_service
from pytest_dflash.config.tables.slo import parse_slo, slo_for
from pytest_dflash.documents import loads_toml
from pytest_dflash.errors import DocumentTooDeep, InventoryError
from pytest_dflash.scrub.redact import mask_url_passwords, one_line

BUILTIN_PROFILES = Path(__file__).parent / "builtin"
# What `python -m pytest_dflash.refserver` needs beyond a plain install: the core of the [refserver] extra.
REFSERVER_MODULES = ("torch", "fastapi", "uvicorn")


def load_profile(path: Path, *, name: str | None = None) -> HostProfile:
    """Read and validate one host profile file."""
    source = str(path)
    try:
        data = loads_toml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InventoryError(source, "", f"cannot read profile: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(source, "", not_utf8(exc)) from None
    except DocumentTooDeep as exc:
        raise InventoryError(source, "", str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(source, "", f"not valid TOML: {exc}") from None
    return profile_from_dict(data, source=path, name=name)


def error_line(exc: InventoryError) -> str:
    """The one line a bad profile, inventory or --attach URL is reported as (pytest's usage error,
    `pytest-dflash check`): control characters escaped (a key or name holding a newline stays one line), URL
    passwords masked."""
    return one_line(mask_url_passwords(str(exc)))


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What a file that is not UTF-8 text is told (TOML, and the inventories, are UTF-8)."""
    line = exc.object[:exc.start].count(b"\n") + 1
    return (f"expected UTF-8 text, got byte 0x{exc.object[exc.start]:02x} at line {line} (offset "
            f"{exc.start}): "
            "save the file as UTF-8")


def profile_from_dict(data: Mapping[str, Any], *, source: Path, name: str | None = None) -> HostProfile:
    """Validate an already-parsed profile (TOML, or a fleet inventory entry)."""
    root = Table(data, str(source), "")
    host = root.sub("host", required=True)
    assert host is not None
    connection_raw = host.get("connection", str, required=True)
    assert connection_raw is not None
    connection, connect_timeout = check_connection(host, connection_raw)
    python = host.get("python", str, "python3")
    assert python is not None
    auto_python = python == "auto"
    if auto_python:
        python = sys.executable
    provision = host.choice("provision", PROVISION_MODES, "allowed")
    profile = HostProfile(
        name=host_name(host, name or source.stem),
        source=source,
        connection=connection,
        python=python,
        services={},
        gpus=host.int_list("gpus"),
        provision=provision,  # type: ignore[arg-type]
        ssh_config=host.get("ssh_config", str),
        ssh_identity_file=host.get("ssh_identity_file", str),
        cuda_home=host.get("cuda_home", str),
        command_timeout_s=host.duration("command_timeout", 30.0),
        connect_timeout_s=connect_timeout,
        become=bool(host.get("become", bool, False)),
        become_user=become_user(host),
    )
    host.done()
    services_table = root.sub("services", required=True)
    assert services_table is not None
    services: dict[str, ServiceSpec] = {}
    for service_name, value in services_table.items():
        if not isinstance(value, dict):
            raise services_table.fail(service_name, f"expected a table [services.{service_name}]")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", service_name):
            raise services_table.fail(service_name, "service names may use letters, digits, '_', '-', '.'")
        sub = services_table.sub(service_name)
        assert sub is not None
        services[service_name] = parse_service(service_name, sub, profile, source.parent)
    if not services:
        raise services_table.fail("", "expected at least one [services.NAME] table")
    if auto_python:
        check_refserver_installed(services, source)
    parity_table = root.sub("parity")
    floors_table = root.sub("floors")
    perf_table = root.sub("perf")
    slo_table = root.sub("slo")
    root.done()
    floors = parse_floors(floors_table, services) if floors_table else {}
    slo = parse_slo(slo_table, services) if slo_table else {}
    for name, table in floors.items():
        # a gate on the SLOs needs SLOs to judge: a loud error now, not an inconclusive test at the end
        needs = [k for k in table if k == "max_concurrency_within_slo" or k.startswith("goodput_at.")]
        if needs and not slo_for(slo, name):
            key = needs[0].split(".")[0]
            raise InventoryError(str(source), f"floors.{name}.{key}",
                                 "needs SLOs to judge: add an [slo] table (ttft_p99_ms, tpot_p99_ms, ...)")
    return dataclasses.replace(
        profile,
        services=services,
        parity=parse_parity(parity_table, services, source.parent) if parity_table else None,
        floors=floors,
        perf=parse_perf(perf_table, services, source.parent) if perf_table else {},
        slo=slo,
    )


def check_refserver_installed(services: Mapping[str, ServiceSpec], source: Path) -> None:
    """Services that run the embedded reference host with the interpreter running pytest (`python = "auto"`,
    the builtin `local`) need the [refserver] extra in this venv: without it, a one-line error naming the
    extra, not an env layer failing on the missing torch of a "host" that is this venv."""
    runs_it = [name for name, spec in services.items() if "pytest_dflash.refserver" in spec.command]
    missing = [module for module in REFSERVER_MODULES if importlib.util.find_spec(module) is None]
    if runs_it and missing:
        raise InventoryError(str(source), f"services.{runs_it[0]}.command",
                             f"runs the embedded reference host with this interpreter ({sys.executable}), "
                             f"which lacks {', '.join(missing)}: pip install 'pytest-dflash[refserver]'")


def resolve_profile_path(spec: str, hosts_dirs: list[Path]) -> Path:
    """A --host value: a path to a .toml file, or a name looked up in the hosts dirs."""
    candidate = Path(spec).expanduser()
    if candidate.suffix == ".toml" or "/" in spec:
        if candidate.is_file():
            return candidate
        raise InventoryError(spec, "", "no such host profile file")
    searched = [*hosts_dirs, BUILTIN_PROFILES]
    for directory in searched:
        path = directory / f"{spec}.toml"
        if path.is_file():
            return path
    known = sorted({p.stem for d in searched if d.is_dir() for p in d.glob("*.toml")})
    raise InventoryError(
        spec, "", f"no host profile named {spec!r} in {', '.join(str(d) for d in searched)}"
        + (f" (known: {', '.join(known)})" if known else "")
    )


def attach_profile(url: str) -> HostProfile:
    """A profile for --attach URL: one external service, no host access. Its name is the server's host:port,
    whatever else is attached, so the same server keeps its verdict file and history from run to run."""
    table = Table({"url": url}, "--attach", "")
    checked = check_url(table, "url", url)
    parsed = urllib.parse.urlparse(checked)
    name = f"{parsed.hostname}:{parsed.port or (443 if parsed.scheme == 'https' else 80)}"
    service = ServiceSpec(name="attached", kind="external", url=checked, algorithm=AUTO)
    return HostProfile(
        name=name,
        source=Path("--attach"),
        connection=None,
        python="python3",
        services={"attached": service},
        provision="never",
    )
