"""Options of the layer modules: each a command-line flag and an ini key of the same name, read CLI first."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

Option = tuple[str, str, str]  # (flag, dest = ini key, help)


def add_text_options(parser: pytest.Parser, options: Sequence[Option]) -> None:
    """Register each (flag, dest, help) as a flag with a metavar from its last word and an ini key `dest`."""
    group = parser.getgroup("dflash")
    for flag, dest, text in options:
        group.addoption(flag, dest=dest, default=None, metavar=flag.rsplit("-", 1)[-1].upper(), help=text)
        parser.addini(dest, text, default="")


def option_text(config: pytest.Config, dest: str) -> str:
    """The option's value as stripped text: the command line, else the ini key, else ''."""
    value = config.getoption(dest)
    if value is None:
        value = config.getini(dest)
    return str(value or "").strip()


def option_source(options: Sequence[Option], dest: str) -> str:
    """'--flag / ini_key', for messages that say where a bad value came from."""
    flag = next(f for f, d, _ in options if d == dest)
    return f"{flag} / {dest}"
