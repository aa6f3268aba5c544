"""The plain (non-speculative) server of a host, for parity's tie triage: the profile's [parity] plain, a NONE
service, or one derived from the reference under --provision (its model and flags minus --speculative-*:
a process command line or a systemd unit template, on a free port and a free GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.errors import DflashError
from pytest_dflash.services.derive import PlainTarget, PlainUnavailable
from pytest_dflash.services.registry import KINDS

if TYPE_CHECKING:
    from pytest_dflash.run.state import ServiceHandle


def derive_plain_spec(reference: ServiceSpec, profile: HostProfile, *, directory: Path, run_id: str,
                      port: int | None = None, taken_gpus: Sequence[int] = ()) -> ServiceSpec:
    """The reference's service without speculation: same model, command / template and vars; new name and port.

    Raises PlainUnavailable when it cannot run beside the host's services (no free GPU, no command).
    """
    name = f"{reference.name}-plain"
    gpus: tuple[int, ...] = ()
    if reference.gpus:
        used = {g for s in profile.services.values() for g in s.gpus} | set(taken_gpus)
        free = [g for g in profile.gpus if g not in used]
        if len(free) < len(reference.gpus):
            raise PlainUnavailable(
                f"no free GPU for a plain server beside {reference.name}: host.gpus = {list(profile.gpus)}, in use "
                f"{sorted(used)}; list a spare GPU in host.gpus or add a plain service to the profile")
        gpus = tuple(free[: len(reference.gpus)])
    kind = KINDS.get(reference.kind)
    if kind is None or kind.derive_plain is None:
        raise PlainUnavailable(f"services.{reference.name} is an external service: nothing to derive a plain server "
                               "from")
    target = PlainTarget(name=name, gpus=gpus, port=port, directory=directory, host=profile.name, run_id=run_id)
    return kind.derive_plain(reference, target)


def plain_service(reference: ServiceHandle, *, port: int | None = None) -> ServiceHandle:
    """The host's non-speculative service for triage: [parity] plain, a NONE service, or one derived (--provision).

    Raises PlainUnavailable with what the user can do about it.
    """
    from pytest_dflash.services.process import state_root

    host = reference.host
    spec = host.profile.parity
    if spec is not None and spec.plain:
        return host.service(spec.plain)
    if not reference.spec.speculative and reference.spec.kind != "external":
        return reference
    for name, service in host.profile.services.items():
        if not service.speculative and service.kind != "external":
            return host.service(name)
    derived = f"{reference.name}-plain"
    if derived in host.services:
        return host.services[derived]
    if not host.provisioning:
        raise PlainUnavailable(
            "no plain (non-speculative) service on this host to read top logprobs from: set [parity] plain = "
            "\"NAME\" in the profile, or run with --provision to let the parity layer start one (the reference's "
            "model and flags minus speculation)")
    taken = [g for h in host.services.values() for g in h.spec.gpus]
    derived_spec = derive_plain_spec(reference.spec, host.profile, directory=state_root() / "derived",
                                     run_id=host.run.run_id, port=port, taken_gpus=taken)
    handle = host.add_service(derived_spec)
    host.notes.append(f"parity: started {derived_spec.name}, a plain server derived from {reference.name} "
                      "(speculative flags removed) for tie triage")
    return handle


def ready_plain(reference: ServiceHandle, *, port: int | None = None) -> tuple[InferenceClient | None, str]:
    """A ready plain server's client (started on first use), or None and the reason."""
    try:
        handle = plain_service(reference, port=port)
        handle.ensure_ready()
    except PlainUnavailable as exc:
        return None, str(exc)
    except DflashError as exc:
        return None, f"the plain server is not usable: {str(exc).splitlines()[0]}"
    return handle.client, handle.name
