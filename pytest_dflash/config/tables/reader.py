"""The TOML table reader every profile table is validated with: typed keys, one-line errors, unknown keys.

Every problem is an `InventoryError` naming the file, the dotted key and what was expected, e.g.

    hosts/ct200.toml: services.dflash.url: expected an http(s) URL, got 'htp:/x'
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from typing import Any, TypeVar

from pytest_dflash.config.durations import MAX_TEXT, DurationError, parse_seconds
from pytest_dflash.errors import InventoryError
from pytest_dflash.scrub.redact import redact_url

T = TypeVar("T")


class Table:
    """A TOML table being consumed key by key; leftovers are reported as unknown keys."""

    def __init__(self, data: Mapping[str, Any], source: str, prefix: str) -> None:
        self._data, self._source, self._prefix = dict(data), source, prefix
        self._seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self._prefix}.{name}" if self._prefix else name

    def fail(self, name: str, expected: str) -> InventoryError:
        return InventoryError(self._source, self.key(name), expected)

    def get(self, name: str, kind: type[T], default: T | None = None, *, required: bool = False) -> T | None:
        self._seen.add(name)
        if name not in self._data:
            if required:
                raise self.fail(name, f"missing required key (expected {_type_name(kind)})")
            return default
        value = self._data[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise self.fail(name, f"expected {_type_name(kind)}, got {describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(name, f"expected a finite number, got {value!r}")
        return value

    def raw(self, name: str) -> Any:
        """The value as written (None when absent), with no type check."""
        self._seen.add(name)
        return self._data.get(name)

    def str_list(self, name: str) -> tuple[str, ...]:
        items = self.get(name, list, [])
        assert items is not None
        if not all(isinstance(item, str) for item in items):
            raise self.fail(name, "expected a list of strings")
        return tuple(items)

    def int_list(self, name: str) -> tuple[int, ...]:
        items = self.get(name, list, [])
        assert items is not None
        if not all(isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in items):
            raise self.fail(name, "expected a list of GPU indices (non-negative integers)")
        return tuple(items)

    def str_map(self, name: str) -> dict[str, str]:
        table = self.get(name, dict, {})
        assert table is not None
        out: dict[str, str] = {}
        for key, value in table.items():
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise self.fail(f"{name}.{key}", f"expected a string or number, got {describe(value)}")
            out[key] = str(value)
        return out

    def duration(self, name: str, default: float) -> float:
        raw = self.raw(name)
        if raw is None:
            return default
        if not isinstance(raw, str | int | float) or isinstance(raw, bool):
            raise self.fail(name, f"expected a duration like 90, '90s' or '15m', got {describe(raw)}")
        try:
            return parse_seconds(raw, where=self.key(name))
        except DurationError as exc:
            if exc.problem == "too long":
                raise self.fail(name, f"expected a duration of at most {MAX_TEXT}, got {raw!r}") from None
            raise self.fail(name, f"expected a duration like 90, '90s' or '15m', got {raw!r}") from None

    def choice(self, name: str, choices: tuple[str, ...], default: str | None = None) -> str | None:
        value = self.get(name, str, default)
        if value is not None and value not in choices:
            raise self.fail(name, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def sub(self, name: str, *, required: bool = False) -> Table | None:
        data = self.get(name, dict, None, required=required)
        return None if data is None else Table(data, self._source, self.key(name))

    def items(self) -> list[tuple[str, Any]]:
        return list(self._data.items())

    def service_tables(self, services: Mapping[str, Any], or_else: str) -> list[tuple[str, Table]]:
        """The sub-tables of this table, each named after one of `services` ([perf.SERVICE], [slo.SERVICE]); a
        sub-table named otherwise fails, saying it is neither a service nor `or_else` (a key of the table)."""
        found: list[tuple[str, Table]] = []
        for key, value in self._data.items():
            if isinstance(value, dict):
                if key not in services:
                    raise self.fail(key,
                                    f"expected a service of this host ({', '.join(services)}) or {or_else}")
                found.append((key, Table(value, self._source, self.key(key))))
                self._seen.add(key)
        return found

    def done(self) -> None:
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            raise self.fail(unknown[0], "unknown key" + did_you_mean(unknown[0], self._seen))


def _type_name(kind: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false",
            list: "a list", dict: "a table"}.get(kind, kind.__name__)


def describe(value: object) -> str:
    kind = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list",
            dict: "table"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text[:40]}" if len(text) <= 40 else f"{kind} {text[:37]}..."


def did_you_mean(name: str, known: set[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"


def parse_url(table: Table, name: str, raw: str, expected: str) -> urllib.parse.ParseResult:
    """urlparse, with a malformed host (an IPv6 address missing its ']', or not an address at all: urllib's
    ValueError) as the table's one-line error. The value is shown with its password masked."""
    try:
        return urllib.parse.urlparse(raw)
    except ValueError as exc:
        raise table.fail(name,
                         f"expected {expected}, got {redact_url(raw)!r} (malformed host: {exc}; an IPv6 "
                         "address is written in brackets, e.g. [fd00::1])") from None
