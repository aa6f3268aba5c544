"""The host's plain (non-speculative) server for parity's tie triage: the profile's [parity] plain, a NONE
service, or one derived from the reference under --provision (services/plain.py derives its spec).
"""

from __future__ import annotations

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.paths import state_root
from pytest_dflash.errors import DflashError
from pytest_dflash.run.handle import ServiceHandle
from pytest_dflash.services.derive import PlainUnavailable
from pytest_dflash.services.plain import derive_plain_spec


def plain_service(reference: ServiceHandle, *, port: int | None = None) -> ServiceHandle:
    """The host's non-speculative service for triage: [parity] plain, a NONE service, or one derived
    (--provision).

    Raises PlainUnavailable with what the user can do about it.
    """
    host = reference.host
    spec = host.profile.parity
    if spec is not None and spec.plain:
        return host.service(spec.plain)
    # NONE, not "not speculative": an attached server whose algorithm is still unknown (AUTO) is no plain one
    if reference.spec.algorithm == "NONE":
        return reference
    for name, service in host.profile.services.items():
        if service.algorithm == "NONE":
            return host.service(name)
    derived = f"{reference.name}-plain"
    if derived in host.services:
        return host.services[derived]
    if not host.provisioning:
        raise PlainUnavailable(
            "no plain (non-speculative) service on this host to read top logprobs from: set [parity] plain = "
            "\"NAME\" in the profile, or run with --provision to let the parity layer start one (the "
            "reference's model and flags minus speculation)")
    taken = [g for h in host.services.values() for g in h.spec.gpus]
    derived_spec = derive_plain_spec(reference.spec, host.profile, directory=state_root() / "derived",
                                     run_id=host.run_id, port=port, taken_gpus=taken)
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
