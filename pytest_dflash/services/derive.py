"""Deriving a non-speculative twin of a service (parity's plain server, services/plain.py): its command line
or unit template without the --speculative-* flags (`strip_speculative_args`, `strip_speculative_text`), its
URL on a new port (`with_port`), what each kind's `Kind.derive_plain` is given (`PlainTarget`), and
`PlainUnavailable`."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_dflash.errors import DflashError


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


def with_port(url: str, port: int | str) -> str:
    parsed = urllib.parse.urlsplit(url.replace("{port}", "0"))
    host = parsed.hostname or "127.0.0.1"
    return urllib.parse.urlunsplit((parsed.scheme, f"{host}:{port}", parsed.path, "", "")).rstrip("/")


@dataclass(frozen=True)
class PlainTarget:
    """Where a derived plain server goes: its name, GPUs and port (None: a free one, or the kind's choice),
    and where a derived file (a unit template) is written."""

    name: str
    gpus: tuple[int, ...]
    port: int | None
    directory: Path
    host: str
    run_id: str
