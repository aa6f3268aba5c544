"""JSON, TOML and YAML documents from outside the process (profiles, inventories, verdict and baseline files,
a server's answers, a host's command output), parsed so that bad input is a ValueError, never a crash.

The parsers follow nesting by recursion: ``[[[[…`` a few hundred (TOML, YAML) or a thousand (JSON) levels deep
raises RecursionError, which no ``except ValueError`` catches and which pytest reports as an INTERNALERROR.
What parses can still be too deep for whatever walks it next (TOML's dotted keys ``[a.a.a.…]`` nest without
recursing in the parser; a copy, a flattening or a redaction of the document recurses per level). So a
document nested more than MAX_DEPTH levels (profiles, inventories, verdicts and SGLang's answers nest a
handful) is refused too: `DocumentTooDeep` (a ValueError), whose message says "nested too deep"; the caller
names the file or URL, as it does for any other unreadable document.
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

import yaml

from pytest_dflash.errors import DocumentTooDeep

__all__ = ["MAX_DEPTH", "loads_json", "loads_toml", "loads_yaml"]

MAX_DEPTH = 64


def loads_json(text: str | bytes, *, strict: bool = True) -> Any:
    """`json.loads(text, strict=strict)`; a document nested deeper than MAX_DEPTH is `DocumentTooDeep`."""
    try:
        data = json.loads(text, strict=strict)
    except RecursionError:
        raise _too_deep("JSON", "arrays or objects") from None
    return _shallow(data, "JSON", "arrays or objects")


def loads_toml(text: str) -> dict[str, Any]:
    """`tomllib.loads(text)`; a document nested deeper than MAX_DEPTH is `DocumentTooDeep`."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise _too_deep("TOML", "tables or arrays") from None
    return _shallow(data, "TOML", "tables or arrays")  # type: ignore[no-any-return]


def loads_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`; a document nested deeper than MAX_DEPTH is `DocumentTooDeep`."""
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise _too_deep("YAML", "mappings or lists") from None
    return _shallow(data, "YAML", "mappings or lists")


def _too_deep(what: str, containers: str) -> DocumentTooDeep:
    return DocumentTooDeep(f"{what} nested too deep ({containers} more than {MAX_DEPTH} levels inside each "
                           "other)")


def _shallow(data: Any, what: str, containers: str) -> Any:
    """`data` when nothing in it is more than MAX_DEPTH levels down (walked level by level, each object or
    list once: a YAML alias shared many times, or one that contains itself, is not walked again)."""
    seen: set[int] = set()
    level: list[Any] = [data]
    for _ in range(MAX_DEPTH):
        below: list[Any] = []
        for node in level:
            if isinstance(node, dict | list) and id(node) not in seen:
                seen.add(id(node))
                below.extend(node.values() if isinstance(node, dict) else node)
        if not below:
            return data
        level = below
    raise _too_deep(what, containers)
