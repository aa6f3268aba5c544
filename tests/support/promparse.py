"""A strict parser of the Prometheus text exposition format (0.0.4), as node_exporter's textfile collector
reads it: raises ValueError on anything the collector would reject or that is ambiguous."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


@dataclass
class Family:
    name: str
    help: str | None = None
    type: str | None = None
    samples: dict[tuple[tuple[str, str], ...], float] = field(default_factory=dict)

    def value(self, **labels: str) -> float:
        return self.samples[tuple(sorted(labels.items()))]

    def series(self) -> list[dict[str, str]]:
        return [dict(key) for key in self.samples]


def _unescape_help(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 >= len(text) or text[i + 1] not in "\\n":
                raise ValueError(f"bad escape in HELP: {text!r}")
            out.append("\n" if text[i + 1] == "n" else "\\")
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _labels(text: str, line: str) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse `{a="x",b="y"}` at the start of text; returns (sorted labels, characters consumed)."""
    assert text[0] == "{"
    i, labels = 1, {}
    while True:
        if text[i] == "}":
            return tuple(sorted(labels.items())), i + 1
        match = LABEL.match(text, i)
        if not match:
            raise ValueError(f"bad label name in {line!r}")
        name = match.group()
        if name in labels:
            raise ValueError(f"label {name} twice in {line!r}")
        i = match.end()
        if text[i:i + 2] != '="':
            raise ValueError(f"expected =\" after {name} in {line!r}")
        i += 2
        value = []
        while True:
            if i >= len(text):
                raise ValueError(f"unterminated label value in {line!r}")
            char = text[i]
            if char == "\\":
                nxt = text[i + 1] if i + 1 < len(text) else ""
                if nxt not in ('\\', '"', "n"):
                    raise ValueError(f"bad escape \\{nxt} in {line!r}")
                value.append("\n" if nxt == "n" else nxt)
                i += 2
            elif char == '"':
                i += 1
                break
            elif char == "\n":
                raise ValueError(f"raw newline in a label value: {line!r}")
            else:
                value.append(char)
                i += 1
        labels[name] = "".join(value)
        if text[i] == ",":
            i += 1
        elif text[i] != "}":
            raise ValueError(f"expected , or }} in {line!r}")


def _value(text: str, line: str) -> float:
    if text in ("NaN", "+Inf", "-Inf"):
        return {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}[text]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"bad value {text!r} in {line!r}") from None


def parse(text: str, *, allow_timestamps: bool = False) -> dict[str, Family]:
    if text and not text.endswith("\n"):
        raise ValueError("the exposition must end with a newline")
    families: dict[str, Family] = {}
    closed: set[str] = set()
    current: str | None = None
    for line in text.split("\n")[:-1]:
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.fullmatch(name):
                    raise ValueError(f"bad metric name in {line!r}")
                family = families.setdefault(name, Family(name))
                if name in closed or (family.samples and parts[1] == "TYPE"):
                    raise ValueError(f"{parts[1]} of {name} after its samples: {line!r}")
                if parts[1] == "HELP":
                    if family.help is not None:
                        raise ValueError(f"second HELP for {name}")
                    family.help = _unescape_help(parts[3] if len(parts) > 3 else "")
                else:
                    if family.type is not None or len(parts) != 4 or parts[3] not in TYPES:
                        raise ValueError(f"bad or second TYPE line {line!r}")
                    family.type = parts[3]
                if current is not None and current != name:
                    closed.add(current)
                current = name
            continue
        match = NAME.match(line)
        if not match:
            raise ValueError(f"bad sample line {line!r}")
        name, rest = match.group(), line[match.end():]
        labels: tuple[tuple[str, str], ...] = ()
        if rest.startswith("{"):
            labels, used = _labels(rest, line)
            rest = rest[used:]
        if not rest.startswith(" "):
            raise ValueError(f"expected a space before the value in {line!r}")
        fields = rest.strip().split(" ")
        if len(fields) == 2 and not allow_timestamps:
            raise ValueError(f"sample timestamps are not allowed in a textfile: {line!r}")
        if len(fields) not in (1, 2):
            raise ValueError(f"trailing garbage in {line!r}")
        family = families.setdefault(name, Family(name))
        if name in closed:
            raise ValueError(f"samples of {name} are not contiguous: {line!r}")
        if current is not None and current != name:
            closed.add(current)
        current = name
        if labels in family.samples:
            raise ValueError(f"duplicate series {line!r}")
        family.samples[labels] = _value(fields[0], line)
    return families
