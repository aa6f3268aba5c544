"""The service kinds, by name: the one place a kind is registered.

A kind is one file behind `services.base.ServiceManager` that defines its `KIND` (a `services.base.Kind`);
run/state.py makes every manager and clears every dead run's leftovers through this registry, and a profile's
`kind = "..."` and the kind's own keys are validated through the kind's profile table (`Kind.table`), which
`register` adds to config/tables/kinds.py. So adding a kind touches its own file and the tuple below (or one
`register` call) and nothing else.

Profiles can be read only once this module is imported (config sits below services and cannot import it): the
pytest plugin imports it through run/state.py, the `pytest-dflash` command itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.config.tables.kinds import KIND_TABLES, KindTable, register_table, unregister_table
from pytest_dflash.errors import ServiceError
from pytest_dflash.services import container, external, process, systemd
from pytest_dflash.services.base import Kind, ServiceHost, ServiceManager

KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> None:
    """Add a kind (its name must be new) and its profile table (a kind without one: a table of only the keys
    every kind shares)."""
    if kind.name in KINDS or kind.name in KIND_TABLES:
        raise ValueError(f"service kind {kind.name!r} is already registered")
    register_table(kind.table or KindTable(kind.name))
    KINDS[kind.name] = kind


def unregister(name: str) -> None:
    """Remove a kind and its profile table (tests that register a kind of their own)."""
    del KINDS[name]
    unregister_table(name)


# In reaping order: a host's own processes first, then its units, then its containers.
for _kind in (process.KIND, systemd.KIND, container.KIND, external.KIND):
    register(_kind)


def make_manager(spec: ServiceSpec, host: ServiceHost) -> ServiceManager:
    """The manager of `spec` on `host`, made by its kind."""
    kind = KINDS.get(spec.kind)
    if kind is None:
        raise ServiceError(f"{host.name}/{spec.name}: unknown service kind {spec.kind!r} (known: "
                           f"{', '.join(KINDS)})")
    return kind.make(spec, host)


def reap_leftovers(host: ServiceHost, specs: Iterable[ServiceSpec]) -> list[str]:
    """Clear what dead runs left on `host`, kind by kind (each given its services among `specs`); returns what
    was done. Call only while holding the host lock."""
    specs = list(specs)
    notes: list[str] = []
    for kind in KINDS.values():
        if kind.reap is not None:
            notes += kind.reap(host, [spec for spec in specs if spec.kind == kind.name])
    return notes
