"""What a profile may say about a service of each kind: one `KindTable` per kind, registered by the kinds.

A [services.NAME] table holds the keys every kind shares (config/tables/services.py reads them) and the keys
of its kind, which the kind's `KindTable.read` reads and checks. A kind's table is defined in the kind's own
file (services/<kind>.py) and registered here by services/registry.py when the kind is registered: config
sits below services in the package order, so it knows the kinds only through `KIND_TABLES`.
config/tables/services.py validates a kind's name against it, config/schema.py builds the JSON Schema's kinds
and their keys from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.config.tables.reader import Table
from pytest_dflash.errors import DflashError

# (the service's table, its spec with every kind's keys filled in, the host, the profile's folder) -> the spec
# with the kind's own keys filled in; a bad key is `table.fail(key, expected)`, a one-line profile error.
Reader = Callable[[Table, ServiceSpec, HostProfile, Path], ServiceSpec]


def _as_is(table: Table, spec: ServiceSpec, host: HostProfile, profile_dir: Path) -> ServiceSpec:
    return spec


def _never(host: HostProfile) -> bool:
    return False


@dataclass(frozen=True)
class KindTable:
    """What a profile may say about a service of one kind (`kind = "name"`), beyond every kind's keys."""

    name: str
    # reads and checks the kind's own keys (and its rules about every kind's keys, e.g. a required `unit`)
    read: Reader = _as_is
    # the kind's own keys -> their JSON Schema (config/schema.py's $defs may be referred to:
    # "#/$defs/strings", "#/$defs/duration", "#/$defs/gpus", "#/$defs/text_map"); on a service of another
    # kind they are unknown keys, unless `elsewhere` says why not
    keys: Mapping[str, Any] = field(default_factory=dict)
    # one of its own keys given on a service of another kind: 'only for kind = "NAME" (<elsewhere>)', {kind}
    # filled in with the other kind; None: an unknown key there
    elsewhere: str | None = None
    # the kind a [services.NAME] table without `kind` gets on this host (the first registered kind that says
    # so; none: `kind` is required)
    default_for: Callable[[HostProfile], bool] = _never
    auto_algorithm: bool = False  # `algorithm` may be left out or "auto": read from /server_info
    auto_port: bool = False  # `{port}` without a fixed `port`: the service gets a free one
    all_gpus: bool = False  # `gpus = "all"` (else only a list of indices): its `read` reads the key's "all"
    # JSON Schema every service of this kind also satisfies (required keys, a wider type of a shared key)
    schema: Mapping[str, Any] = field(default_factory=dict)


KIND_TABLES: dict[str, KindTable] = {}


def register_table(table: KindTable) -> None:
    """Add a kind's table (its name must be new); services/registry.py calls this as it registers the kind."""
    if table.name in KIND_TABLES:
        raise ValueError(f"the profile table of service kind {table.name!r} is already registered")
    KIND_TABLES[table.name] = table


def unregister_table(name: str) -> None:
    """Remove a kind's table (tests that register a kind of their own)."""
    del KIND_TABLES[name]


def kind_tables() -> Mapping[str, KindTable]:
    """The registered kinds' tables. Raises DflashError when none is: the kinds register through
    services/registry.py, which the pytest plugin and the `pytest-dflash` command import."""
    if not KIND_TABLES:
        raise DflashError("no service kinds are registered: import pytest_dflash.services.registry (the "
                          "pytest plugin and the pytest-dflash command do) before reading a host profile")
    return KIND_TABLES
