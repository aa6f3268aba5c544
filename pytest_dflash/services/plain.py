"""A plain (non-speculative) server derived from a speculative one, for parity's tie triage
(layers/parity/plain.py picks or starts it): the reference's model and flags minus --speculative-*, as a
process command line or a systemd unit template, on a free port and a free GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.services.derive import PlainTarget, PlainUnavailable
from pytest_dflash.services.registry import KINDS


def derive_plain_spec(reference: ServiceSpec, profile: HostProfile, *, directory: Path, run_id: str,
                      port: int | None = None, taken_gpus: Sequence[int] = ()) -> ServiceSpec:
    """The reference's service without speculation: same model, command / template and vars; new name and
    port.

    Raises PlainUnavailable when it cannot run beside the host's services (no free GPU, no command).
    """
    name = f"{reference.name}-plain"
    gpus: tuple[int, ...] = ()
    if reference.gpus:
        used = {g for s in profile.services.values() for g in s.gpus} | set(taken_gpus)
        free = [g for g in profile.gpus if g not in used]
        if len(free) < len(reference.gpus):
            raise PlainUnavailable(
                f"no free GPU for a plain server beside {reference.name}: host.gpus = {list(profile.gpus)}, "
                f"in use {sorted(used)}; list a spare GPU in host.gpus or add a plain service to the profile")
        gpus = tuple(free[: len(reference.gpus)])
    kind = KINDS.get(reference.kind)
    if kind is None or kind.derive_plain is None:
        raise PlainUnavailable(f"services.{reference.name} is an external service: nothing to derive a plain "
                               "server from")
    target = PlainTarget(name=name, gpus=gpus, port=port, directory=directory, host=profile.name,
                         run_id=run_id)
    return kind.derive_plain(reference, target)
