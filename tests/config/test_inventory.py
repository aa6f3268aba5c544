"""--fleet: folders of profiles and Ansible-style inventories become validated host profiles — resolved by the
real ansible-inventory when it is installed, by the built-in parser otherwise (both are tested)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from pytest_dflash.config.inventory import (
    ANSIBLE_ENV,
    ansible_inventory,
    empty_shard_line,
    load_fleet,
    parse_shard,
    select_shard,
    shard_of,
)
from pytest_dflash.errors import InventoryError

BESIDE_PYTHON = Path(sys.executable).parent / "ansible-inventory"
ANSIBLE = shutil.which("ansible-inventory") or (str(BESIDE_PYTHON) if BESIDE_PYTHON.exists() else None)
needs_ansible = pytest.mark.skipif(ANSIBLE is None, reason="ansible-inventory is not installed "
                                                          "(apt-get install ansible-core; .ci/run installs it)")


@pytest.fixture(params=["builtin", pytest.param("ansible", marks=needs_ansible)])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once with the built-in parser and once with the real ansible-inventory."""
    monkeypatch.setenv(ANSIBLE_ENV, "none" if request.param == "builtin" else str(ANSIBLE))
    return str(request.param)


@pytest.fixture
def builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in parser's own messages (ansible-inventory words structural errors its own way)."""
    monkeypatch.setenv(ANSIBLE_ENV, "none")

BASE = """
[host]
connection = "ssh://root@placeholder?timeout=3"
python = "/opt/venv/bin/python"

[services.dflash]
unit = "sglang-dflash.service"
algorithm = "DFLASH"
url = "http://{address}:30001"
"""


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "gpu-base.toml"
    path.write_text(BASE)
    return path


def test_yaml_inventory_groups_children_and_vars(tmp_path: Path, base: Path, parser: str) -> None:
    inventory = tmp_path / "fleet.yml"
    inventory.write_text("""
all:
  vars:
    dflash_profile: gpu-base.toml
    ansible_user: root
  children:
    blackwell:
      vars: {dflash_gpus: [0, 1]}
      hosts:
        ct200: {ansible_host: 10.1.2.200}
        ct201: {ansible_host: 10.1.2.201, ansible_port: 2222}
    hopper:
      hosts:
        h1: {ansible_host: 10.1.3.1, dflash_python: /venv2/bin/python}
""")
    profiles = {p.name: p for p in load_fleet(str(inventory), tmp_path)}
    assert set(profiles) == {"ct200", "ct201", "h1"}
    assert profiles["ct200"].connection == "ssh://root@10.1.2.200?timeout=3"
    assert profiles["ct201"].connection == "ssh://root@10.1.2.201:2222?timeout=3"
    assert profiles["ct200"].gpus == (0, 1) and profiles["h1"].gpus == ()
    assert profiles["h1"].python == "/venv2/bin/python"
    assert profiles["ct201"].services["dflash"].url == "http://10.1.2.201:30001"  # {address}
    only = {p.name for p in load_fleet(f"{inventory}:hopper", tmp_path)}
    assert only == {"h1"}


def test_ini_inventory(tmp_path: Path, base: Path, parser: str) -> None:
    inventory = tmp_path / "fleet.ini"
    inventory.write_text("""
[gpus]
ct200 ansible_host=10.1.2.200
ct201 ansible_host=10.1.2.201 dflash_gpus="[3]"

[gpus:vars]
dflash_profile=gpu-base.toml
ansible_user=root

[canary]
local0 ansible_connection=local dflash_profile=local
""")
    profiles = {p.name: p for p in load_fleet(f"{inventory}:gpus", tmp_path)}
    assert profiles["ct201"].gpus == (3,) and profiles["ct200"].connection.startswith("ssh://root@10.1.2.200")
    everything = {p.name for p in load_fleet(str(inventory), tmp_path)}
    assert everything == {"ct200", "ct201", "local0"}


def test_folder_of_profiles(tmp_path: Path, base: Path) -> None:
    (tmp_path / "other.toml").write_text(BASE.replace("DFLASH", "DDTREE"))
    assert [p.name for p in load_fleet(str(tmp_path), tmp_path)] == ["gpu-base", "other"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("all:\n  hosts:\n    x: {ansible_host: 1.2.3.4}\n", "x.dflash_profile: missing"),
        ("all:\n  hosts: [a, b]\n", "all.hosts: expected a mapping"),
        ("all:\n  children:\n    g: {hosts: {x: {dflash_profile: nope.toml}}}\n", "nope.toml: no such host profile file"),
        ("all: [\n", "not valid YAML"),
    ],
)
def test_bad_inventory_is_one_line(tmp_path: Path, base: Path, builtin: None, text: str, message: str) -> None:
    inventory = tmp_path / "bad.yml"
    inventory.write_text(text)
    with pytest.raises(InventoryError) as info:
        load_fleet(str(inventory), tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_base_profile_errors_name_the_host(tmp_path: Path, parser: str) -> None:
    (tmp_path / "b.toml").write_text(BASE.replace('url = "http://{address}:30001"', 'url = "nope"'))
    inventory = tmp_path / "f.yml"
    inventory.write_text("all:\n  hosts:\n    gpu9: {ansible_host: 10.0.0.9, dflash_profile: b.toml}\n")
    with pytest.raises(InventoryError, match=r"b\.toml \(host gpu9 of inventory f\.yml\): services\.dflash\.url: expected an http"):
        load_fleet(str(inventory), tmp_path)


def test_unknown_group_lists_the_known_ones(tmp_path: Path, base: Path, parser: str) -> None:
    inventory = tmp_path / "f.yml"
    inventory.write_text("gpus:\n  hosts:\n    a: {dflash_profile: gpu-base.toml, ansible_host: 1.1.1.1}\n")
    with pytest.raises(InventoryError, match="no such group .*gpus"):
        load_fleet(f"{inventory}:cpus", tmp_path)


RANGE_INVENTORY = """
[gpus]
gpu[01:04]

[canary]
local0 ansible_connection=local

[blackwell:children]
gpus
"""
SCRIPT = """#!/usr/bin/env python3
import json, sys
if "--host" in sys.argv:
    print("{}")
else:
    print(json.dumps({
        "hopper": {"hosts": ["h1", "h2"], "vars": {"dflash_profile": "gpu-base.toml", "ansible_user": "svc"}},
        "_meta": {"hostvars": {"h1": {"ansible_host": "10.3.0.1"}, "h2": {"ansible_host": "10.3.0.2",
                                                                         "dflash_gpus": [2, 3]}}},
    }))
"""


@pytest.fixture
def ansible(monkeypatch: pytest.MonkeyPatch) -> str:
    if ANSIBLE is None:
        pytest.skip("ansible-inventory is not installed (apt-get install ansible-core; .ci/run installs it)")
    monkeypatch.delenv(ANSIBLE_ENV, raising=False)
    assert ansible_inventory() == ANSIBLE, "found without configuration, as a user's run would find it"
    return ANSIBLE


def test_ansible_resolves_ranges_group_vars_and_host_vars(tmp_path: Path, base: Path, ansible: str) -> None:
    (tmp_path / "inventory.ini").write_text(RANGE_INVENTORY)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("dflash_profile: gpu-base.toml\nansible_user: root\n")
    (tmp_path / "group_vars" / "blackwell.yml").write_text("dflash_gpus: [0, 1]\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "gpu03.yml").write_text("ansible_host: 10.1.2.203\nansible_port: 2203\n")
    (tmp_path / "host_vars" / "local0.yml").write_text("dflash_profile: local\n")
    profiles = {p.name: p for p in load_fleet(f"{tmp_path / 'inventory.ini'}:blackwell", tmp_path)}
    assert sorted(profiles) == ["gpu01", "gpu02", "gpu03", "gpu04"], "gpu[01:04] is four hosts"
    assert profiles["gpu01"].connection == "ssh://root@gpu01?timeout=3"
    assert profiles["gpu03"].connection == "ssh://root@10.1.2.203:2203?timeout=3"  # host_vars/gpu03.yml
    assert profiles["gpu03"].services["dflash"].url == "http://10.1.2.203:30001"
    assert all(p.gpus == (0, 1) for p in profiles.values())  # group_vars/blackwell.yml via the children group
    everyone = {p.name: p for p in load_fleet(str(tmp_path / "inventory.ini"), tmp_path)}
    assert sorted(everyone) == ["gpu01", "gpu02", "gpu03", "gpu04", "local0"]
    assert everyone["local0"].is_local and everyone["local0"].gpus == ()


def test_ansible_runs_a_dynamic_inventory_script(tmp_path: Path, base: Path, ansible: str) -> None:
    script = tmp_path / "cmdb.py"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    profiles = {p.name: p for p in load_fleet(f"{script}:hopper", tmp_path)}
    assert profiles["h1"].connection == "ssh://svc@10.3.0.1?timeout=3"
    assert profiles["h2"].gpus == (2, 3) and profiles["h2"].services["dflash"].url == "http://10.3.0.2:30001"


def test_a_dynamic_script_without_ansible_names_what_to_install(tmp_path: Path, base: Path, builtin: None) -> None:
    script = tmp_path / "cmdb.py"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    with pytest.raises(InventoryError, match=r"cmdb\.py: a dynamic inventory script needs ansible-inventory "
                                             r"\(apt-get install ansible-core"):
        load_fleet(str(script), tmp_path)


@pytest.mark.parametrize(
    ("name", "text", "mode", "message"),
    [
        ("bad.yml", "all:\n  hosts: [a, b]\n", 0o644, 'Invalid "hosts" entry for "all" group, requires a dictionary'),
        ("bad.yml", "all: [\n", 0o644, "not valid YAML: did not find expected node content (line 2, column 1)"),
        ("bad.ini", "[gpus]\nx y\n", 0o644, "bad.ini:2: Expected key=value host variable assignment, got: y"),
        ("broken.py", "#!/bin/sh\necho 'cmdb down' >&2\nexit 3\n", 0o755, "cmdb down"),
    ],
)
def test_ansible_errors_are_one_line(tmp_path: Path, base: Path, ansible: str, name: str, text: str, mode: int,
                                     message: str) -> None:
    inventory = tmp_path / name
    inventory.write_text(text)
    inventory.chmod(mode)
    with pytest.raises(InventoryError) as info:
        load_fleet(str(inventory), tmp_path)
    assert str(info.value).startswith(f"{inventory}: ansible-inventory: ")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_missing_ansible_inventory_executable_is_one_line(tmp_path: Path, base: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f.ini").write_text("[g]\nx dflash_profile=gpu-base.toml\n")
    monkeypatch.setenv(ANSIBLE_ENV, str(tmp_path / "no-such-ansible-inventory"))
    with pytest.raises(InventoryError, match=r"f\.ini: cannot run .*no-such-ansible-inventory \(No such file"):
        load_fleet(str(tmp_path / "f.ini"), tmp_path)


def test_shards_partition_the_fleet_deterministically() -> None:
    names = [f"gpu{i:03d}" for i in range(200)]
    shards = [[n for n in names if shard_of(n, 8) == i] for i in range(1, 9)]
    assert sorted(n for shard in shards for n in shard) == names  # a partition: every host in exactly one shard
    assert all(shards), "200 hosts over 8 shards: none empty"
    assert [shard_of(n, 8) for n in names] == [shard_of(n, 8) for n in names]
    # adding hosts never moves existing ones
    assert all(shard_of(n, 8) == shard_of(n, 8) for n in [*names, "new-host"])
    assert select_shard({}, 1, 2) == {}


def test_an_empty_shard_says_how_many_hosts_it_left_to_which_shards() -> None:
    names = [f"gpu{i}" for i in range(3)]
    held = sorted({shard_of(n, 4) for n in names})
    empty = next(i for i in range(1, 5) if i not in held)
    line = empty_shard_line(empty, 4, names)
    assert line.startswith(f"shard {empty}/4 holds 0 of 3 hosts (all in shard{'s' if len(held) > 1 else ''} "
                           f"{', '.join(f'{i}/4' for i in held)}): no host was tested by this run")


@pytest.mark.parametrize("raw", ["0/2", "3/2", "x", "1/0", "2"])
def test_bad_shard(raw: str) -> None:
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(raw)
