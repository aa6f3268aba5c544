"""Fleets: many hosts from a folder of profiles or an Ansible-style inventory, and sharding over CI runners.

    --fleet hosts/                      every *.toml profile in the folder
    --fleet inventory.yml[:GROUP]       an Ansible YAML inventory (default group: all)
    --fleet inventory.ini[:GROUP]       an Ansible INI inventory
    --fleet inventory.py[:GROUP]        a dynamic inventory script (needs ansible-inventory)
    --shard 2/8                         this runner takes the 2nd of 8 deterministic host shards

Inventories are resolved by Ansible itself when `ansible-inventory` is installed (`ansible-inventory -i FILE
--list`: host ranges such as gpu[01:64], group_vars/ and host_vars/ beside the inventory, inventory plugins
and dynamic scripts, exactly as a playbook sees them). It is looked up in $DFLASH_ANSIBLE_INVENTORY (a path,
or "none" for the built-in parser), then on PATH, then next to the running Python (a venv's bin/). Without it,
a built-in parser reads static YAML and INI inventories (groups, children, vars; no ranges, no group_vars
files).

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
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from pytest_dflash.config.loader import load_profile, not_utf8, profile_from_dict, resolve_profile_path
from pytest_dflash.config.profiles import HostProfile
from pytest_dflash.config.tables.host import host_name_problem
from pytest_dflash.documents import loads_json, loads_toml, loads_yaml
from pytest_dflash.errors import DocumentTooDeep, InventoryError


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


def empty_shard_line(index: int, count: int, names: Iterable[str]) -> str:
    """What a shard holding none of the fleet's hosts says: 'shard 1/2 holds 0 of 3 hosts (all in shard 2/2):
    …'. A CI matrix wider than its fleet has such shards; the fleet's verdict is the merge of them all."""
    hosts = list(names)
    others = sorted({shard_of(name, count) for name in hosts})
    where = ", ".join(f"{i}/{count}" for i in others)
    return (f"shard {index}/{count} holds 0 of {len(hosts)} host{'s' if len(hosts) != 1 else ''} "
            f"(all in shard{'s' if len(others) != 1 else ''} {where}): no host was tested by this run; "
            "the fleet's verdict is `pytest-dflash merge` over every shard's verdicts")


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


ANSIBLE_ENV = "DFLASH_ANSIBLE_INVENTORY"
ANSIBLE_TIMEOUT_S = 120.0  # a dynamic inventory script may query a CMDB; it may not hang the run
INSTALL_HINT = "apt-get install ansible-core, or pip install ansible-core"


def ansible_inventory() -> str | None:
    """The ansible-inventory executable that resolves inventories, or None for the built-in parser."""
    override = os.environ.get(ANSIBLE_ENV)
    if override is not None:
        return None if override.strip().lower() in ("", "none", "0", "off", "builtin") else override
    beside_python = Path(sys.executable).parent / "ansible-inventory"
    return shutil.which("ansible-inventory") or (str(beside_python) if os.access(beside_python, os.X_OK)
                                                 else None)


def _read_text(path: Path, what: str) -> str:
    """A UTF-8 file's text; unreadable or not UTF-8: the one-line error naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(str(path), "", f"cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(str(path), "", not_utf8(exc)) from None


def _inventory_hosts(path: Path, group: str) -> dict[str, dict[str, Any]]:
    executable = ansible_inventory()
    script = _is_script(path)
    # A static inventory is UTF-8, whoever parses it (the same error with and without ansible-inventory).
    text = "" if script else _read_text(path, "inventory")
    if executable is not None:
        return _ansible_hosts(executable, path, group)
    if script:
        raise InventoryError(str(path), "",
                             f"a dynamic inventory script needs ansible-inventory ({INSTALL_HINT})")
    if path.suffix in (".yml", ".yaml"):
        try:
            data = loads_yaml(text) or {}
        except yaml.YAMLError as exc:
            raise InventoryError(str(path), "", f"not valid YAML: {str(exc).splitlines()[0]}") from None
        except DocumentTooDeep as exc:
            raise InventoryError(str(path), "", str(exc)) from None
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


def _is_script(path: Path) -> bool:
    if not os.access(path, os.X_OK):
        return False
    with path.open("rb") as handle:
        return handle.read(2) == b"#!"


def _ansible_hosts(executable: str, path: Path, group: str) -> dict[str, dict[str, Any]]:
    """The hosts of `group` and their merged vars, as `ansible-inventory -i PATH --list` resolves them."""
    data = _ansible_list(executable, path)
    meta = data.pop("_meta", {}) if isinstance(data.get("_meta"), dict) else {}
    hostvars: Mapping[str, Any] = meta.get("hostvars") or {}
    groups = {name: body for name, body in data.items() if isinstance(body, dict)}
    groups.setdefault("all", {"children": [g for g in groups if g != "all"]})
    if group not in groups:
        raise InventoryError(str(path), group, f"no such group (groups: {', '.join(sorted(groups))})")
    members: dict[str, None] = {}  # ordered set
    pending, seen = [group], set()
    while pending:
        name = pending.pop(0)
        if name in seen or name not in groups:
            continue
        seen.add(name)
        members.update(dict.fromkeys(str(h) for h in groups[name].get("hosts") or []))
        pending.extend(str(c) for c in groups[name].get("children") or [])
    return {host: dict(hostvars.get(host) or {}) for host in members}


def _ansible_list(executable: str, path: Path) -> dict[str, Any]:
    env = {**os.environ, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_DEPRECATION_WARNINGS": "False"}
    try:
        done = subprocess.run([executable, "-i", str(path), "--list"], capture_output=True, text=True,
                              env=env, errors="replace", timeout=ANSIBLE_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              check=False)
    except subprocess.TimeoutExpired:
        raise InventoryError(str(path), "",
                             f"ansible-inventory did not finish within {ANSIBLE_TIMEOUT_S:g} s "
                             "(a dynamic inventory script that hangs?)") from None
    except OSError as exc:
        raise InventoryError(str(path), "",
                             f"cannot run {executable} ({exc.strerror or exc}; {INSTALL_HINT}, "
                             f"or set {ANSIBLE_ENV}=none for the built-in parser)") from None
    if done.returncode != 0:
        raise InventoryError(str(path), "", f"ansible-inventory: {_ansible_error(done.stderr, path)}")
    try:
        data = loads_json(done.stdout)
    except ValueError as exc:
        raise InventoryError(str(path), "", f"ansible-inventory printed no JSON inventory ({exc})") from None
    if not isinstance(data, dict):
        raise InventoryError(str(path), "", "ansible-inventory printed no JSON inventory (not an object)")
    return data


_PLUGIN_FAILURE = re.compile(r"Failed to parse .*? with (\S+) plugin: (.*)")
_YAML_SYNTAX = re.compile(r"Syntax Error while loading YAML\.\s*(.*?)\s*The error appears to be in '[^']*': "
                          r"(line \d+, column \d+)")


def _ansible_error(stderr: str, path: Path) -> str:
    """The one line of ansible-inventory's (wrapped, multi-message) stderr that says what is wrong."""
    messages = [" ".join(chunk.split()) for chunk in re.split(r"\[WARNING\]:|ERROR!", stderr)
                if chunk.strip()]
    failures = {m.group(1): m.group(2) for text in messages if (m := _PLUGIN_FAILURE.search(text))}
    preferred = ("script" if _is_script(path) else "yaml" if path.suffix in (".yml", ".yaml", ".json")
                 else "ini")
    text = (failures.get(preferred) or next(iter(failures.values()), None)
            or (messages[-1] if messages else ""))
    text = text.lstrip("* ").strip()
    if syntax := _YAML_SYNTAX.search(text):
        text = f"not valid YAML: {syntax.group(1)} ({syntax.group(2)})"
    return (text[:400] + " …" if len(text) > 400 else text) or "failed with no message"


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
                    raise InventoryError(source, f"line {number}",
                                         f"expected key=value after the host, got {part!r}")
                hostvars[key] = _scalar(value)
            groups[current]["hosts"][parts[0]] = hostvars
    groups.setdefault("all", {"hosts": {}, "vars": {}, "children": []})
    groups["all"]["children"] = [g for g in groups if g != "all"]
    return groups


def _scalar(value: str) -> Any:
    try:
        return loads_toml(f"v = {value}")["v"]
    except ValueError:  # not a TOML value (nested too deep included): the text as it is
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
    problem = host_name_problem(name)
    if problem:
        raise InventoryError(str(inventory), "hosts", f"expected a host name {problem}, got {name!r}")
    where = f"{name}.dflash_profile"
    base_ref = hostvars.get("dflash_profile")
    if not isinstance(base_ref, str):
        raise InventoryError(str(inventory), where,
                             "missing: each host needs a dflash_profile (a base profile)")
    candidate = inventory.parent / base_ref
    base_path = candidate if candidate.is_file() else resolve_profile_path(base_ref, [hosts_dir])
    try:
        data = copy.deepcopy(loads_toml(base_path.read_text(encoding="utf-8")))
    except UnicodeDecodeError as exc:
        raise InventoryError(str(base_path), "", f"cannot read base profile: {not_utf8(exc)}") from None
    except (OSError, ValueError) as exc:  # TOMLDecodeError, DocumentTooDeep
        raise InventoryError(str(base_path), "", f"cannot read base profile: {exc}") from None
    host = data.setdefault("host", {})
    host["name"] = name
    connection = hostvars.get("ansible_connection")
    if connection == "local":
        host["connection"] = "local://"
    elif "ansible_host" in hostvars or "ansible_user" in hostvars or "ansible_port" in hostvars:
        address = str(hostvars.get("ansible_host", name))
        if ":" in address and not address.startswith("["):
            address = f"[{address}]"  # an IPv6 address, as a URL writes it
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
    # Named for what it is, the base profile as the inventory's host, not a file of its own (an "@host.toml"
    # name read as one that does not exist); in the base profile's folder, so relative paths (unit templates)
    # stay relative to it.
    source = base_path.with_name(f"{base_path.name} (host {name} of inventory {inventory.name})")
    return profile_from_dict(data, source=source, name=name)
