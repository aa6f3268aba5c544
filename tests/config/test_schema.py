"""The host-profile JSON Schema (config/schema.py) agrees with the validator (config/loader.py, config/tables/):
the same keys per table, every shipped profile validates, and broken profiles the validator rejects are rejected
too."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pytest_dflash.config.loader import BUILTIN_PROFILES, load_profile, profile_from_dict
from pytest_dflash.config.schema import profile_schema
from pytest_dflash.errors import InventoryError

ROOT = Path(__file__).parents[2]
SHIPPED = sorted([*ROOT.glob("hosts/*.toml"), *ROOT.glob("tools/device/*.toml"), BUILTIN_PROFILES / "local.toml"])
VALIDATOR = jsonschema.Draft202012Validator(profile_schema())
FULL = {
    "host": {"connection": "ssh://root@10.0.0.1"},
    "services": {"a": {"kind": "systemd", "unit": "a.service", "algorithm": "DFLASH", "port": 30001},
                 "b": {"kind": "systemd", "unit": "b.service", "algorithm": "NONE", "port": 30002}},
    # a container service: its table also knows the container keys
    "services_c": {"kind": "container", "image": "lmsysorg/sglang:v0.5.17", "algorithm": "DFLASH", "port": 30003},
    "parity": {"reference": "b"},
    "floors": {"a": {"output_tok_s": 1}},
    "perf": {"a": {"requests": 2}},
}
UNKNOWN = "zzzzzzzzzzzz"  # no close match, so the validator lists every key it knows


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(profile_schema())
    assert profile_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p))
def test_every_shipped_profile_validates(path: Path) -> None:
    load_profile(path)  # the validator accepts it ...
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in VALIDATOR.iter_errors(tomllib.loads(path.read_text()))]
    assert errors == []  # ... and so does the schema


def _known_keys(data: dict[str, Any], table: tuple[str, ...]) -> set[str]:
    """The keys the validator accepts in one table, from its own 'unknown key (known: …)' answer."""
    data = {**data, "services": {**data["services"], "c": data.pop("services_c")}} if table[-1:] == ("c",) else \
        {k: v for k, v in data.items() if k != "services_c"}
    target = data
    for part in table:
        target = target.setdefault(part, {})
    target[UNKNOWN] = 1
    with pytest.raises(InventoryError) as info:
        profile_from_dict(data, source=Path("sync.toml"))
    match = re.search(r"unknown key \(known: (.*)\)$", str(info.value))
    assert match, str(info.value)
    return set(match.group(1).split(", "))


def _schema_keys(*refs: str) -> set[str]:
    node: dict[str, Any] = profile_schema()
    for ref in refs:
        node = node[ref]
    return set(node["properties"])


@pytest.mark.parametrize(
    ("table", "schema_path"),
    [
        ((), ()),
        (("host",), ("$defs", "host")),
        (("services", "a"), ("$defs", "service")),
        (("services", "c"), ("$defs", "service")),
        (("parity",), ("$defs", "parity")),
        (("perf", "a"), ("$defs", "perf_service")),
    ],
)
def test_the_schema_knows_exactly_the_validators_keys(table: tuple[str, ...], schema_path: tuple[str, ...]) -> None:
    import copy

    from pytest_dflash.services.container import CONTAINER_KEYS

    schema = _schema_keys(*schema_path)
    if table == ("services", "a"):  # a systemd service: the container keys are unknown keys there
        schema -= set(CONTAINER_KEYS)
    assert schema == _known_keys(copy.deepcopy(FULL), table)


def test_perf_and_floor_keys_match_the_validator() -> None:
    import copy

    perf = _known_keys(copy.deepcopy(FULL), ("perf",)) - set(FULL["services"])  # service names are tables there
    assert _schema_keys("$defs", "perf") == perf
    from pytest_dflash.config.tables.floors import FLOOR_KEYS, FLOOR_SETTINGS, SWEEP_FLOORS

    assert _schema_keys("$defs", "floors") == {*FLOOR_KEYS, *FLOOR_SETTINGS, *SWEEP_FLOORS}


GOOD = """
[host]
connection = "ssh://root@10.1.2.200"

[services.dflash]
unit = "sglang-dflash.service"
algorithm = "DFLASH"
port = 30001

[services.plain]
kind = "external"
url = "http://10.1.2.200:30000"
"""


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('connection = "ssh://root@10.1.2.200"', 'connection = "ftp://x"'),
        ('connection = "ssh://root@10.1.2.200"', 'conection = "ssh://x"'),
        ('algorithm = "DFLASH"', 'algorithm = "FLASH"'),
        ('algorithm = "DFLASH"', 'algorithm = "auto"'),  # auto only for external services
        ('algorithm = "DFLASH"\n', ""),
        ("port = 30001", "port = 70000"),
        ("port = 30001", 'port = "30001"'),
        ('url = "http://10.1.2.200:30000"', 'url = "htp:/x"'),
        ('unit = "sglang-dflash.service"', 'unit = "sglang-dflash"'),
        ('kind = "external"', 'kind = "docker"'),
        ("[services.plain]", "[services.plain]\nready_timeout = \"soon\""),
        ("[services.plain]", "[services.plain]\nready_timeout = -1"),
        ("[services.plain]", "[services.plain]\ngpus = [-1]"),
        ("[services.plain]", "[services.plain]\nenv = {A = true}"),
        ('kind = "external"', 'kind = "process"'),  # process needs a command
        ("[services.plain]", "[services.\"bad name\"]"),
        ("[host]", '[host]\nprovision = "sometimes"'),
        ("[host]", "[host]\npython = 3"),
        ("", "[parity]\ncompare = []\n"),  # parity needs a reference
        ("", "[parity]\nreference = 'dflash'\nmax_tie_rate = 2.0\n"),
        ("", "[floors.dflash]\noutput_tok_s = -5\n"),
        ("", "[floors.dflash]\ntok_s = 5\n"),
        ("", "[floors.dflash]\nttft_p99_ms = 1\nspeedup = 2.0\n"),  # speedup without speedup_vs
        ("", "[floors.dflash]\nconfidence = 0.3\n"),
        ("", "[perf]\nendpoint = 'grpc'\n"),
        ("", "[perf]\nconcurrency = 0\n"),
        ("", "[perf]\nwarmup = 1\n[perf.dflash]\nrequest = 3\n"),
        ("", "[extra]\nx = 1\n"),
        ("[services.plain]", '[services.plain]\nimage = "sglang"'),  # a container key on an external service
        ("[services.plain]", '[services.plain]\nlog_file = "relative.log"'),
        ("[services.plain]", "[services.plain]\nready_timeout = 1e308"),  # past the 7-day maximum
        ("[host]", '[host]\nname = "rack1/gpu7"'),
        ("[host]", '[host]\nname = ""'),
        ("[host]", '[host]\nname = "gpu\\u001b7"'),
        ('connection = "ssh://root@10.1.2.200"', 'connection = "ssh://root@[fd00::1"'),
    ],
)
def test_broken_profiles_are_rejected_by_both(tmp_path: Path, old: str, new: str) -> None:
    text = GOOD.replace(old, new, 1) if old else GOOD + new
    assert text != GOOD
    path = tmp_path / "broken.toml"
    path.write_text(text)
    with pytest.raises(InventoryError):
        load_profile(path)
    assert not VALIDATOR.is_valid(tomllib.loads(text)), text


def test_the_good_profile_is_valid_for_both(tmp_path: Path) -> None:
    (tmp_path / "good.toml").write_text(GOOD)
    load_profile(tmp_path / "good.toml")
    assert VALIDATOR.is_valid(tomllib.loads(GOOD))


def test_an_ipv6_host_and_a_7_day_budget_are_valid_for_both(tmp_path: Path) -> None:
    text = GOOD.replace("root@10.1.2.200", "root@[fd00::1]:2222").replace(
        "[services.plain]", '[services.plain]\nready_timeout = 604800\nsampled_timeout = "168h"')
    (tmp_path / "good.toml").write_text(text)
    assert load_profile(tmp_path / "good.toml").services["dflash"].url == "http://[fd00::1]:30001"
    assert VALIDATOR.is_valid(tomllib.loads(text))
