"""Parsing of human-written quantities (durations) at the edge, with the source named on error.

Every duration is finite and at most MAX_SECONDS (7 days): a budget or deadline beyond that is a typo
(`ready_timeout = 1e308`, `"99999999999999999999h"`), and one that large breaks the waits built on it (a
thread's `join(1e308)` raises OverflowError; `inf` or `nan` never end, or end at once).
"""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MAX_SECONDS = 7 * 24 * 3600.0  # 7 days: longer than any budget a run needs, short enough for every wait API
MAX_TEXT = "7 days (604800s, 168h)"


class DurationError(ValueError):
    """A value that is not a duration (`problem` "not a duration", "negative", "not finite") or is one longer
    than MAX_SECONDS ("too long"). The message names where it came from."""

    def __init__(self, message: str, problem: str) -> None:
        super().__init__(message)
        self.problem = problem


def parse_seconds(raw: str | float | int, *, where: str) -> float:
    """'90', '90s', '5m', '250ms', 1.5 -> seconds, at most MAX_SECONDS. Raises DurationError naming
    `where`."""
    if isinstance(raw, bool):
        raise DurationError(f"{where}: {raw!r} is not a duration (try 90, 90s, 5m)", "not a duration")
    if isinstance(raw, int | float):
        if isinstance(raw, float) and not math.isfinite(raw):
            raise DurationError(f"{where}: {raw!r} is not a finite duration (try 90, 90s, 5m)", "not finite")
        if raw < 0:
            raise DurationError(f"{where}: {raw!r} is negative", "negative")
        seconds = raw  # an int is compared before float(): float(10**400) raises OverflowError
    else:
        match = _DURATION.match(raw)
        if not match:
            raise DurationError(f"{where}: {raw!r} is not a duration (try 90, 90s, 5m, 250ms)",
                                "not a duration")
        seconds = float(match.group(1)) * _SCALE[match.group(2)]  # 400 digits: float() gives inf, still > max
    if seconds > MAX_SECONDS:
        raise DurationError(f"{where}: {raw!r} is longer than the maximum, {MAX_TEXT}", "too long")
    return float(seconds)


def format_seconds(seconds: float) -> str:
    """A short human form: 0.25s, 12.3s, 4m05s."""
    if seconds < 60:
        return f"{seconds:.2f}s" if seconds < 10 else f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"
