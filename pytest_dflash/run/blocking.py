"""Who blocks whom: the failures recorded so far, and the skip message of a test they block.

A failure in a lower layer (the order is config/layers.py) turns that host's higher-layer tests into skips
that name the root failure, instead of dozens of red tests that all say "connection refused". Host-wide
layers (host, env, kernels) block everything on the host, except a host-layer failure of particular GPUs
(errors.GpuFault: an Xid, ECC, memory held by another process on GPU 4), which blocks only the services whose
`gpus` include one of them; service layers block the higher layers of the same service only (a dead DFLASH
service does not hide a DDTREE result).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pytest_dflash.config.layers import HOST_WIDE, rank
from pytest_dflash.scrub.bounds import LINE_BYTES, scrub

BLOCKED_PREFIX = "blocked: "


@dataclass(frozen=True)
class Failure:
    """A recorded failure of one layer on one host (optionally one service)."""

    host: str
    layer: str
    service: str | None
    test: str
    summary: str
    # a host-layer failure of particular GPUs (errors.GpuFault): it blocks only the services on them
    gpus: tuple[int, ...] | None = None
    gpu_labels: tuple[str, ...] = ()

    def blocks(self, layer: str, services: Iterable[str],
               service_gpus: Mapping[str, tuple[int, ...]] | None = None) -> bool:
        if rank(self.layer) >= rank(layer):
            # same layer: only a service that died blocks the rest of its own layer
            return False
        if self.gpus is not None:
            # a bad GPU: the services that use it (or may: one that names no GPU), never a host-wide check
            given = service_gpus or {}
            return any(not given.get(s) or set(given[s]) & set(self.gpus) for s in services)
        if self.layer in HOST_WIDE or self.service is None:
            return True
        return self.service in set(services)


@dataclass
class LayerBook:
    """Failures seen so far in this process, to decide which later tests are blocked."""

    failures: list[Failure] = field(default_factory=list)
    dead: dict[tuple[str, str], Failure] = field(default_factory=dict)
    # (host, service) -> the GPUs its profile gives it: what a GPU-scoped failure blocks
    service_gpus: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)

    def record(self, failure: Failure) -> None:
        self.failures.append(failure)

    def scope_to_gpus(self, test: str, gpus: tuple[int, ...], labels: tuple[str, ...]) -> None:
        """The failure `test` recorded concerns these GPUs only (errors.GpuFault)."""
        for i, failure in enumerate(self.failures):
            if failure.test == test and failure.gpus is None:
                self.failures[i] = dataclasses.replace(failure, gpus=gpus, gpu_labels=labels)

    def record_death(self, failure: Failure) -> None:
        """A service died: every later test that needs it is blocked, whatever its layer."""
        self.dead.setdefault((failure.host, failure.service or ""), failure)

    def blocker(self, host: str, layer: str, services: Iterable[str]) -> Failure | None:
        services = list(services)
        for service in services:
            death = self.dead.get((host, service))
            if death is not None:
                return death
        gpus = {name: g for (h, name), g in self.service_gpus.items() if h == host}
        for failure in self.failures:
            if failure.host == host and failure.blocks(layer, services, gpus):
                return failure
        return None


def blocked_reason(failure: Failure) -> str:
    where = f"{failure.host}/{failure.service}" if failure.service else failure.host
    if failure.gpu_labels:
        where += f" {', '.join(failure.gpu_labels)}"
    return blocked_message(f"{failure.layer} layer failed on {where} ({failure.test}): {failure.summary}")


def blocked_message(text: str) -> str:
    """The skip message of a test blocked by `text` (a failure summary): redacted and one line's size, as it
    goes to the terminal, JUnit, HTML and the verdict."""
    return scrub(f"{BLOCKED_PREFIX}{text}", LINE_BYTES, "skip reason", keep="head")


def is_blocked(skip_message: str) -> bool:
    """Was this skip a block (a lower layer or the service failed), not a plain skip?"""
    return skip_message.startswith(BLOCKED_PREFIX)
