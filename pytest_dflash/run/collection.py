"""Collection: which host / service / pair each dflash test runs against, and in which order.

Tests ask for `dflash_host`, `dflash_service`, `dflash_service_raw` or `dflash_pair`; each is parametrized
over the run's hosts and their services here. Items are then sorted so the lower layers of a host run first
(they can block the higher ones). Node ids are pytest's own (no xdist `@group` suffix): under xdist the
controller finds a test's host in its id (`param_ids`, fleet/scheduling.py) and keeps a host on one worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_dflash.config.layers import LAYERS, rank
from pytest_dflash.config.options import testinfra_hosts_hint
from pytest_dflash.config.profiles import AUTO, HostProfile, ServiceSpec
from pytest_dflash.config.targets import EMPTY_SHARD_KEY
from pytest_dflash.run.state import DflashRun

DFLASH_FIXTURES = ("dflash_host", "dflash_service", "dflash_service_raw", "dflash_pair")
GPU_FIXTURE = "dflash_gpu"  # the host / env / kernels layers' view of a host (layers/gpu/hooks.py)
DOES_NOT_APPLY = "does not apply to "  # the skip reason's start: a test with nothing on a host to run against
SERVICES_MARKER = ("dflash_services(speculative=None, algorithms=None): run only against services that match "
                   "(e.g. speculative=True for accept-length checks)")


@dataclass
class ItemInfo:
    """What a test item targets: one host, some services of it, one layer."""

    host: str
    services: tuple[str, ...]
    layer: str
    param: str
    blocked: bool = False
    diagnosis: list[dict[str, str]] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)  # a host-layer failure of these GPUs only (errors.GpuFault)


INFO_KEY = pytest.StashKey[ItemInfo]()


def selected(spec: ServiceSpec, marker: pytest.Mark | None) -> bool:
    """Does the service match the test's `dflash_services` marker?"""
    if marker is None:
        return True
    speculative = marker.kwargs.get("speculative")
    algorithms = marker.kwargs.get("algorithms")
    if spec.algorithm == AUTO:  # an attached server that could not be asked: nothing algorithm-specific
        return speculative is None and not algorithms
    if speculative is not None and spec.speculative != speculative:
        return False
    return not (algorithms and spec.algorithm not in algorithms)


def param_ids(profiles: Mapping[str, HostProfile]) -> dict[str, set[str]]:
    """Every parameter id `parametrize` can give a host's tests (before any marker filter): the host, its
    `host/service`s and `host/reference~compared` pairs. The xdist controller reads a test's host from
    these."""
    ids: dict[str, set[str]] = {}
    for host, profile in profiles.items():
        ids[host] = {host, *(f"{host}/{service}" for service in profile.services)}
        if profile.parity is not None:
            reference = profile.parity.reference
            ids[host].update(f"{host}/{reference}~{compared}" for compared in profile.parity.compare)
    return ids


def parametrize(metafunc: pytest.Metafunc, run: DflashRun) -> None:
    """Parametrize the dflash fixture a test asks for over the run's hosts / services / parity pairs."""
    names = metafunc.fixturenames
    marker = metafunc.definition.get_closest_marker("dflash_services")
    if "dflash_pair" in names:
        pairs: list[Any] = []
        for host, profile in run.profiles.items():
            parity = profile.parity
            if parity is None:
                pairs.append(does_not_apply(host, "no [parity] table (a reference service and the ones "
                                                  "compared with it)"))
                continue
            found = [_param(f"{host}/{parity.reference}~{compared}") for compared in parity.compare
                     if selected(profile.services[compared], marker)]
            pairs.extend(found or [does_not_apply(host, f"no service its [parity] table compares matches "
                                                        f"{_marker_text(marker)}")])
        metafunc.parametrize("dflash_pair", pairs, indirect=True)
    elif "dflash_service" in names or "dflash_service_raw" in names:
        fixture = "dflash_service" if "dflash_service" in names else "dflash_service_raw"
        params: list[Any] = []
        for host, profile in run.profiles.items():
            found = [_param(f"{host}/{service}") for service, spec in profile.services.items()
                     if selected(spec, marker)]
            params.extend(found or [does_not_apply(host, f"no service matches {_marker_text(marker)}")])
        metafunc.parametrize(fixture, params, indirect=True)
    elif "dflash_host" in names:
        metafunc.parametrize("dflash_host", list(run.profiles), indirect=True, ids=list(run.profiles))


def does_not_apply(host: str, why: str) -> Any:
    """The one case of a test on a host that has nothing it applies to: a skip that says so, counted for that
    host (not pytest's 'got empty parameter set' and a [NOTSET] row that belong to no host)."""
    return pytest.param(host, id=host, marks=pytest.mark.skip(reason=f"{DOES_NOT_APPLY}{host}: {why}"))


def _param(value: str) -> Any:
    return pytest.param(value, id=value)


def _marker_text(marker: pytest.Mark | None) -> str:
    kwargs = ", ".join(f"{k}={v!r}" for k, v in (marker.kwargs if marker else {}).items())
    return f"this test's dflash_services({kwargs})"


def uses_dflash(item: pytest.Item) -> bool:
    return any(name in getattr(item, "fixturenames", ()) for name in DFLASH_FIXTURES)


def item_info(item: pytest.Item) -> ItemInfo | None:
    """The host, services and layer of a parametrized dflash test (None for any other test)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    layer_mark = next((m.name for m in item.iter_markers() if m.name in LAYERS), None)
    for name in ("dflash_pair", "dflash_service", "dflash_service_raw", "dflash_host"):
        if name in callspec.params:
            if not isinstance(callspec.params[name], str):
                return None  # an empty parameter set (e.g. no [parity] table): pytest skips it itself
            param = callspec.params[name]
            host, sep, rest = param.partition("/")  # no "/": a host the test does not apply to
            if name == "dflash_pair":
                services: tuple[str, ...] = tuple(rest.split("~")) if sep else ()
            elif name == "dflash_host":
                host, services = param, ()
            else:
                services = (rest,) if sep else ()
            default = "host" if name == "dflash_host" else "generation"
            return ItemInfo(host, services, layer_mark or default, param)
    return None


def record_needed(run: DflashRun | None, items: list[pytest.Item]) -> None:
    """What each host's tests of the final selection (after -k / -m deselection) use: the services (what the
    pre-flight readies and what starts together, so a deselected test's server is never touched) and whether
    any reads its GPUs (then the pre-flight probes them)."""
    if run is None:
        return
    for item in items:
        info = item.stash.get(INFO_KEY, None)
        if info is not None:
            host = run.host(info.host)
            host.needed.update(info.services)
            host.gpu_tested = host.gpu_tested or GPU_FIXTURE in getattr(item, "fixturenames", ())


def order_items(config: pytest.Config, run: DflashRun | None, items: list[pytest.Item]) -> None:
    """Record each item's target and sort the lower layers of each host first."""
    dflash_items = [item for item in items if uses_dflash(item)]
    if run is None or not dflash_items:
        return
    if not run.profiles and EMPTY_SHARD_KEY in config.stash:
        config.hook.pytest_deselected(items=dflash_items)
        items[:] = [item for item in items if item not in dflash_items]
        return
    if not run.profiles:
        raise pytest.UsageError(
            f"{len(dflash_items)} pytest-dflash tests were collected but no target was given: "
            "pass --host NAME|PATH (e.g. --host local), --attach URL or --fleet FILE"
            + testinfra_hosts_hint(config)
        )
    order = {name: index for index, name in enumerate(run.profiles)}
    for item in items:
        info = item_info(item)
        if info is None:
            continue
        item.stash[INFO_KEY] = info

    def key(item: pytest.Item) -> tuple[int, int]:
        info = item.stash.get(INFO_KEY, None)
        return (order.get(info.host, 0), rank(info.layer)) if info else (len(order), len(LAYERS))

    items.sort(key=key)  # stable: lower layers of a host run first, so they can block higher ones
