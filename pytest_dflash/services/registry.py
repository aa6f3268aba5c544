"""The service kinds, by name: the one place a kind is registered.

A kind is one file behind `services.base.ServiceManager` that defines its `KIND` (a `services.base.Kind`);
run/state.py makes every manager and clears every dead run's leftovers through this registry, so adding a kind
touches its own file and the tuple below (or one `register` call) and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.errors import ServiceError
from pytest_dflash.services import container, external, process, systemd
from pytest_dflash.services.base import Kind, ServiceHost, ServiceManager

# In reaping order: a host's own processes first, then its units, then its containers.
KINDS: dict[str, Kind] = {kind.name: kind for kind in (process.KIND, systemd.KIND, container.KIND,
                                                       external.KIND)}


def register(kind: Kind) -> None:
    """Add a kind (its name must be new)."""
    if kind.name in KINDS:
        raise ValueError(f"service kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind


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
