"""The {name} placeholders of unit templates, service commands and log commands: filled in, or listed.

systemd's own ${VAR} is not a placeholder and is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def render(template: str, values: Mapping[str, str], *, where: str) -> str:
    """Replace {name} placeholders; systemd's own ${VAR} is left alone. Unknown names are errors."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(f"{where}: unknown placeholder {{{name}}} (known: {', '.join(sorted(values))})")
        return values[name]

    return _PLACEHOLDER.sub(one, template)


def placeholders(text: str) -> set[str]:
    return set(_PLACEHOLDER.findall(text))
