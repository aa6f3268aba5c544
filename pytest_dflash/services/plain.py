"""The plain (non-speculative) server of a host, for parity's tie triage: the profile's [parity] plain, a NONE
service, or one derived from the reference under --provision (its model and flags minus --speculative-*:
a process command line or a systemd unit template, on a free port and a free GPU).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.profiles import HostProfile, ServiceSpec
from pytest_dflash.errors import DflashError

if TYPE_CHECKING:
    from pytest_dflash.run.state import ServiceHandle


class PlainUnavailable(DflashError):
    """No non-speculative service can be had for tie triage (the message says why)."""


_SPEC_FLAG = re.compile(r"--speculative-[A-Za-z0-9-]+")


def strip_speculative_args(args: Sequence[str]) -> tuple[str, ...]:
    """A server command line without its --speculative-* flags (and their values)."""
    out: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        if _SPEC_FLAG.fullmatch(arg):
            skip_value = True
            continue
        if arg.startswith("--speculative-") and "=" in arg:
            continue
        out.append(arg)
    return tuple(out)


_TEMPLATE_FLAG = re.compile(
    r"[ \t]+--speculative-[A-Za-z0-9-]+(?:=\S+|(?:[ \t]*\\\n)?[ \t]+(?![-\\])\S+)?")


def strip_speculative_text(text: str) -> str:
    """A unit template without --speculative-* flags; continuation lines left empty are dropped."""
    stripped = _TEMPLATE_FLAG.sub("", text)
    lines = stripped.split("\n")
    kept = [line for line in lines if line.strip() != "\\"]
    return "\n".join(kept)


def _with_port(url: str, port: int | str) -> str:
    parsed = urllib.parse.urlsplit(url.replace("{port}", "0"))
    host = parsed.hostname or "127.0.0.1"
    return urllib.parse.urlunsplit((parsed.scheme, f"{host}:{port}", parsed.path, "", "")).rstrip("/")


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
    if reference.kind == "process":
        command = strip_speculative_args(reference.command)
        if reference.port is not None:
            command = tuple("{port}" if part == str(reference.port) else part for part in command)
        if not any("{port}" in part for part in command):
            raise PlainUnavailable(f"services.{reference.name}.command has no {{port}} placeholder to move the "
                                   "plain server to a free port")
        return ServiceSpec(name=name, kind="process", url=_with_port(reference.url, "{port}"), algorithm="NONE",
                           command=command, env=reference.env, vars=reference.vars, gpus=gpus, port=port,
                           ready_timeout_s=reference.ready_timeout_s, sampled_timeout_s=reference.sampled_timeout_s,
                           api_key_env=reference.api_key_env, model=reference.model)
    if reference.kind == "systemd":
        if reference.template is None or reference.unit is None or reference.port is None:
            raise PlainUnavailable(f"services.{reference.name} has no unit template to derive a plain server from")
        try:
            text = reference.template.read_text(encoding="utf-8")
        except OSError as exc:
            raise PlainUnavailable(f"cannot read {reference.template}: {exc}") from None
        directory.mkdir(parents=True, exist_ok=True)
        template = directory / f"{profile.name}.{name}.{run_id}.service"
        template.write_text(strip_speculative_text(text), encoding="utf-8")
        new_port = port if port is not None else reference.port + 100
        return ServiceSpec(name=name, kind="systemd", url=_with_port(reference.url, new_port), algorithm="NONE",
                           unit=reference.unit.removesuffix(".service") + "-plain.service", template=template,
                           env=reference.env, vars=reference.vars, gpus=gpus, port=new_port,
                           ready_timeout_s=reference.ready_timeout_s, sampled_timeout_s=reference.sampled_timeout_s,
                           api_key_env=reference.api_key_env, model=reference.model)
    raise PlainUnavailable(f"services.{reference.name} is an external service: nothing to derive a plain server from")


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
