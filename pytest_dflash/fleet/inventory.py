"""Fleets: many hosts from a folder of profiles or an Ansible-style inventory, and sharding over CI runners.

    --fleet hosts/                      every *.toml profile in the folder
    --fleet inventory.yml[:GROUP]       an Ansible YAML inventory (default group: all)
    --fleet inventory.ini[:GROUP]       an Ansible INI inventory
    --shard 2/8                         this runner takes the 2nd of 8 deterministic host shards

An inventory host becomes a profile: its `dflash_profile` var names a base TOML profile (relative to the
inventory file, or a name in --hosts-dir), and the Ansible connection vars override how it is reached:

    ansible_host / ansible_user / ansible_port   -> [host].connection = ssh://user@host:port
    ansible_connection = local                  -> [host].connection = local://
    ansible_ssh_private_key_file                -> [host].ssh_identity_file
    dflash_python, dflash_gpus                  -> [host].python, [host].gpus

Use `url = "http://{address}:30001"` in the base profile so service URLs follow each host's address.
"""

from __future__ import annotations

import copy
import hashlib
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pytest_dflash.config.profiles import HostProfile, load_profile, profile_from_dict, resolve_profile_path
from pytest_dflash.errors import InventoryError


def parse_shard(raw: str) -> tuple[int, int]:
    try:
        index_text, count_text = raw.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise ValueError(f"--shard: {raw!r} is not I/N (e.g. 2/8)") from None
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard: {raw!r} needs 1 <= I <= N")
    return index, count


def shard_of(name: str, count: int) -> int:
    """1-based shard of a host: stable for a host whatever else is in the fleet (sha1 of the name)."""
    return int(hashlib.sha1(name.encode()).hexdigest(), 16) % count + 1


def select_shard(profiles: Mapping[str, HostProfile], index: int, count: int) -> dict[str, HostProfile]:
    return {name: p for name, p in profiles.items() if shard_of(name, count) == index}


def load_fleet(spec: str, hosts_dir: Path) -> list[HostProfile]:
    """Profiles of every host named by a --fleet value."""
    path_text, group = spec, "all"
    if not Path(spec).exists() and ":" in spec:
        path_text, _, group = spec.rpartition(":")
    path = Path(path_text).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.toml"))
        if not files:
            raise InventoryError(str(path), "", "no *.toml host profiles in this folder")
        return [load_profile(f) for f in files]
    if not path.is_file():
        raise InventoryError(spec, "", "no such fleet folder or inventory file")
    hosts = _inventory_hosts(path, group)
    if not hosts:
        raise InventoryError(str(path), group, "the group has no hosts")
    return [_profile_for(path, name, hostvars, hosts_dir) for name, hostvars in sorted(hosts.items())]


def _inventory_hosts(path: Path, group: str) -> dict[str, dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yml", ".yaml"):
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise InventoryError(str(path), "", f"not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise InventoryError(str(path), "", "expected a mapping of groups at the top level")
        groups = _yaml_groups(data, str(path))
    else:
        groups = _ini_groups(text, str(path))
    if group not in groups:
        raise InventoryError(str(path), group, f"no such group (groups: {', '.join(sorted(groups))})")
    # Variables come from every group a host is in (all < parent < child < host), whichever group is selected.
    everyone = _resolve(groups, "all", {}, str(path), ())
    members = set(_resolve(groups, group, {}, str(path), ()))
    return {name: hostvars for name, hostvars in everyone.items() if name in members}


Group = dict[str, Any]  # {"hosts": {name: vars}, "vars": {...}, "children": [names]}


def _yaml_groups(data: Mapping[str, Any], source: str) -> dict[str, Group]:
    groups: dict[str, Group] = {}

    def visit(name: str, body: Any) -> None:
        body = body or {}
        if not isinstance(body, dict):
            raise InventoryError(source, name, "expected a group mapping (hosts / vars / children)")
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise InventoryError(source, f"{name}.hosts", "expected a mapping of host names to vars")
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise InventoryError(source, f"{name}.children", "expected a mapping of child groups")
        group = groups.setdefault(name, {"hosts": {}, "vars": {}, "children": []})
        group["hosts"].update({h: (v or {}) for h, v in hosts.items()})
        group["vars"].update(body.get("vars") or {})
        for child, child_body in children.items():
            group["children"].append(child)
            visit(child, child_body)

    for name, body in data.items():
        visit(name, body)
    if "all" not in groups:
        groups["all"] = {"hosts": {}, "vars": {}, "children": [g for g in groups if g != "all"]}
    return groups


def _ini_groups(text: str, source: str) -> dict[str, Group]:
    groups: dict[str, Group] = {"ungrouped": {"hosts": {}, "vars": {}, "children": []}}
    current, kind = "ungrouped", "hosts"
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            name, _, suffix = line[1:-1].partition(":")
            kind = suffix or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise InventoryError(source, f"line {number}", f"unknown section suffix :{kind}")
            current = name
            groups.setdefault(name, {"hosts": {}, "vars": {}, "children": []})
            continue
        if kind == "children":
            groups[current]["children"].append(line)
        elif kind == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise InventoryError(source, f"line {number}", f"expected key=value, got {line!r}")
            groups[current]["vars"][key.strip()] = _scalar(value.strip())
        else:
            parts = shlex.split(line)
            hostvars: dict[str, Any] = {}
            for part in parts[1:]:
                key, sep, value = part.partition("=")
                if not sep:
                    raise InventoryError(source, f"line {number}", f"expected key=value after the host, got {part!r}")
                hostvars[key] = _scalar(value)
            groups[current]["hosts"][parts[0]] = hostvars
    groups.setdefault("all", {"hosts": {}, "vars": {}, "children": []})
    groups["all"]["children"] = [g for g in groups if g != "all"]
    return groups


def _scalar(value: str) -> Any:
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def _resolve(groups: Mapping[str, Group], name: str, inherited: Mapping[str, Any], source: str,
             seen: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    if name in seen:
        raise InventoryError(source, name, f"group cycle: {' -> '.join((*seen, name))}")
    group = groups.get(name)
    if group is None:
        raise InventoryError(source, name, "child group is not defined")
    variables = {**inherited, **group["vars"]}
    hosts: dict[str, dict[str, Any]] = {}
    for child in group["children"]:
        for host, hostvars in _resolve(groups, child, variables, source, (*seen, name)).items():
            hosts.setdefault(host, {}).update(hostvars)
    for host, hostvars in group["hosts"].items():
        hosts[host] = {**variables, **hosts.get(host, {}), **hostvars}
    return hosts


def _profile_for(inventory: Path, name: str, hostvars: Mapping[str, Any], hosts_dir: Path) -> HostProfile:
    where = f"{name}.dflash_profile"
    base_ref = hostvars.get("dflash_profile")
    if not isinstance(base_ref, str):
        raise InventoryError(str(inventory), where, "missing: each host needs a dflash_profile (a base profile)")
    candidate = inventory.parent / base_ref
    base_path = candidate if candidate.is_file() else resolve_profile_path(base_ref, [hosts_dir])
    try:
        data = copy.deepcopy(tomllib.loads(base_path.read_text(encoding="utf-8")))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InventoryError(str(base_path), "", f"cannot read base profile: {exc}") from None
    host = data.setdefault("host", {})
    host["name"] = name
    connection = hostvars.get("ansible_connection")
    if connection == "local":
        host["connection"] = "local://"
    elif "ansible_host" in hostvars or "ansible_user" in hostvars or "ansible_port" in hostvars:
        address = hostvars.get("ansible_host", name)
        user = hostvars.get("ansible_user")
        port = hostvars.get("ansible_port")
        old = str(host.get("connection", ""))
        query = old.partition("?")[2]
        netloc = f"{user}@{address}" if user else str(address)
        host["connection"] = f"ssh://{netloc}{f':{port}' if port else ''}{f'?{query}' if query else ''}"
    if "ansible_ssh_private_key_file" in hostvars:
        host["ssh_identity_file"] = str(hostvars["ansible_ssh_private_key_file"])
    if "dflash_python" in hostvars:
        host["python"] = hostvars["dflash_python"]
    if "dflash_gpus" in hostvars:
        host["gpus"] = hostvars["dflash_gpus"]
    # Relative paths (unit templates) stay relative to the base profile's folder.
    return profile_from_dict(data, source=base_path.with_name(f"{base_path.stem}@{name}.toml"), name=name)
