"""Parsing of human-written quantities (durations) at the edge, with the source named on error."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_seconds(raw: str | float | int, *, where: str) -> float:
    """'90', '90s', '5m', '250ms', 1.5 -> seconds. Raises ValueError naming `where`."""
    if isinstance(raw, bool):
        raise ValueError(f"{where}: {raw!r} is not a duration (try 90, 90s, 5m)")
    if isinstance(raw, int | float):
        if raw < 0:
            raise ValueError(f"{where}: {raw!r} is negative")
        return float(raw)
    match = _DURATION.match(raw)
    if not match:
        raise ValueError(f"{where}: {raw!r} is not a duration (try 90, 90s, 5m, 250ms)")
    return float(match.group(1)) * _SCALE[match.group(2)]


def format_seconds(seconds: float) -> str:
    """A short human form: 0.25s, 12.3s, 4m05s."""
    if seconds < 60:
        return f"{seconds:.2f}s" if seconds < 10 else f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"
