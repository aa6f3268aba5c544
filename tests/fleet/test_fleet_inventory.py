"""--fleet: folders of profiles and Ansible-style inventories become validated host profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dflash.errors import InventoryError
from pytest_dflash.fleet.inventory import load_fleet, parse_shard, select_shard, shard_of

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


def test_yaml_inventory_groups_children_and_vars(tmp_path: Path, base: Path) -> None:
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


def test_ini_inventory(tmp_path: Path, base: Path) -> None:
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
def test_bad_inventory_is_one_line(tmp_path: Path, base: Path, text: str, message: str) -> None:
    inventory = tmp_path / "bad.yml"
    inventory.write_text(text)
    with pytest.raises(InventoryError) as info:
        load_fleet(str(inventory), tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_base_profile_errors_name_the_host(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text(BASE.replace('url = "http://{address}:30001"', 'url = "nope"'))
    inventory = tmp_path / "f.yml"
    inventory.write_text("all:\n  hosts:\n    gpu9: {ansible_host: 10.0.0.9, dflash_profile: b.toml}\n")
    with pytest.raises(InventoryError, match=r"b@gpu9\.toml: services\.dflash\.url: expected an http"):
        load_fleet(str(inventory), tmp_path)


def test_unknown_group_lists_the_known_ones(tmp_path: Path, base: Path) -> None:
    inventory = tmp_path / "f.yml"
    inventory.write_text("gpus:\n  hosts:\n    a: {dflash_profile: gpu-base.toml, ansible_host: 1.1.1.1}\n")
    with pytest.raises(InventoryError, match="no such group .*gpus"):
        load_fleet(f"{inventory}:cpus", tmp_path)


def test_shards_partition_the_fleet_deterministically() -> None:
    names = [f"gpu{i:03d}" for i in range(200)]
    shards = [[n for n in names if shard_of(n, 8) == i] for i in range(1, 9)]
    assert sorted(n for shard in shards for n in shard) == names  # a partition: every host in exactly one shard
    assert all(shards), "200 hosts over 8 shards: none empty"
    assert [shard_of(n, 8) for n in names] == [shard_of(n, 8) for n in names]
    # adding hosts never moves existing ones
    assert all(shard_of(n, 8) == shard_of(n, 8) for n in [*names, "new-host"])
    assert select_shard({}, 1, 2) == {}


@pytest.mark.parametrize("raw", ["0/2", "3/2", "x", "1/0", "2"])
def test_bad_shard(raw: str) -> None:
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(raw)
