"""documents.py: JSON, TOML and YAML nested too deep are a ValueError naming it, never a RecursionError; what
nests a little parses as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_dflash.documents import MAX_DEPTH, loads_json, loads_toml, loads_yaml
from pytest_dflash.errors import DflashError, DocumentTooDeep


@pytest.mark.parametrize(("load", "text", "what"), [
    (loads_json, "[" * 100_000, "JSON"),
    (loads_json, "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2), "JSON"),  # parses; walking it would recurse  # unterminated: the parser recurses before it finds the end
    (loads_json, "[" * 100_000 + "]" * 100_000, "JSON"),
    (loads_json, '{"a":' * 100_000 + "1" + "}" * 100_000, "JSON"),
    (loads_toml, "a = " + "[" * 500 + "]" * 500, "TOML"),
    (loads_toml, "[" + ".".join(["a"] * (MAX_DEPTH + 2)) + "]", "TOML"),
    (loads_yaml, "a: " + "[" * 3000 + "]" * 3000, "YAML"),
    (loads_yaml, "a: " + "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2), "YAML"),
])
def test_nested_too_deep_is_a_value_error_naming_it(load: Callable[[str], Any], text: str, what: str) -> None:
    with pytest.raises(ValueError, match=f"^{what} nested too deep") as info:
        load(text)
    assert isinstance(info.value, DocumentTooDeep) and isinstance(info.value, DflashError)


def test_what_nests_a_little_parses_as_before() -> None:
    assert loads_json(b'{"a": [[1]]}') == {"a": [[1]]}
    assert loads_toml("a = [[1]]\n[b.c]\nd = 1\n") == {"a": [[1]], "b": {"c": {"d": 1}}}
    deep = "[" + ".".join(["a"] * (MAX_DEPTH - 2)) + "]"
    assert loads_toml(deep)["a"]["a"]


def test_a_yaml_alias_used_many_times_or_inside_itself_is_walked_once() -> None:
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))
    assert len(loads_yaml(laughs)["i"]) == 9  # 9**9 leaves if each alias were walked again
    loop = loads_yaml("a: &x [*x]\n")
    assert loop["a"][0] is loop["a"]


def test_other_bad_documents_stay_their_parsers_errors() -> None:
    with pytest.raises(ValueError) as info:
        loads_json("{")
    assert not isinstance(info.value, DocumentTooDeep)
