"""The hosts under test: --host profiles, --attach URLs and --fleet inventories, narrowed by --shard."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_dflash.config import inventory
from pytest_dflash.config.loader import attach_profile, error_line, load_profile, resolve_profile_path
from pytest_dflash.config.options import option
from pytest_dflash.config.profiles import HostProfile
from pytest_dflash.errors import InventoryError

# the run's profiles, loaded first (report/started.py)
TARGETS_KEY = pytest.StashKey[dict[str, HostProfile]]()
NAMED_HOSTS_KEY = pytest.StashKey[tuple[str, ...]]()  # every host the run names, before --shard
EMPTY_SHARD_KEY = pytest.StashKey[str]()


def load_targets(config: pytest.Config) -> dict[str, HostProfile]:
    """Every profile the options name, validated (a bad one is a one-line UsageError, exit 4)."""
    hosts_dir = Path(str(option(config, "dflash_hosts_dir")))
    if not hosts_dir.is_absolute():
        hosts_dir = (config.invocation_params.dir / hosts_dir).resolve()
    profiles: dict[str, HostProfile] = {}
    try:
        for spec in option(config, "dflash_hosts") or []:
            profile = load_profile(resolve_profile_path(spec, [hosts_dir]))
            profiles[profile.name] = profile
        urls = list(option(config, "dflash_attach") or [])
        log_commands = attach_log_commands(config, len(urls))
        for index, url in enumerate(urls):
            profile = with_log_command(attach_profile(url, index), log_commands[index])
            profiles[profile.name] = profile
        for spec in option(config, "dflash_fleet") or []:
            for profile in inventory.load_fleet(str(spec), hosts_dir):
                if profile.name in profiles:
                    raise InventoryError(str(spec), profile.name,
                                         "this host name is already used by another profile")
                profiles[profile.name] = profile
    except InventoryError as exc:
        raise pytest.UsageError(error_line(exc)) from None
    # every host the run names, before --shard takes its share
    config.stash[NAMED_HOSTS_KEY] = tuple(profiles)
    shard = str(option(config, "dflash_shard") or "")
    if shard:
        try:
            index, count = inventory.parse_shard(shard)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        selected = inventory.select_shard(profiles, index, count)
        if profiles and not selected:
            config.stash[EMPTY_SHARD_KEY] = inventory.empty_shard_line(index, count, profiles)
        profiles = selected
    return profiles


def attach_log_commands(config: pytest.Config, attached: int) -> list[str | None]:
    """--attach-log-command: one for every --attach, or one per --attach in order."""
    commands = [str(c).strip() for c in option(config, "dflash_attach_log_command") or [] if str(c).strip()]
    if not commands:
        return [None] * attached
    if not attached:
        raise pytest.UsageError("--attach-log-command / dflash_attach_log_command: needs --attach URL")
    if len(commands) == 1:
        return [commands[0]] * attached
    if len(commands) != attached:
        raise pytest.UsageError(f"--attach-log-command / dflash_attach_log_command: given {len(commands)} "
                                f"times for {attached} --attach URLs (give it once, or once per --attach)")
    return list(commands)


def with_log_command(profile: HostProfile, command: str | None) -> HostProfile:
    """An --attach profile whose service reads its log with `command` (run on this machine, read-only)."""
    if command is None:
        return profile
    services = {name: dataclasses.replace(spec, log_command=command)
                for name, spec in profile.services.items()}
    return dataclasses.replace(profile, services=services)


def named_despite_errors(config: pytest.Config) -> list[str]:
    """The hosts the options name, as far as they can be read when loading them failed (a usage error): each
    profile that loads, the file stem of one that does not (a profile's default name), each attach URL that
    parses, each inventory that loads. Their old verdicts must not stand for a run that never tested them."""
    hosts_dir = Path(str(option(config, "dflash_hosts_dir")))
    if not hosts_dir.is_absolute():
        hosts_dir = (config.invocation_params.dir / hosts_dir).resolve()
    names: list[str] = []
    for spec in option(config, "dflash_hosts") or []:
        try:
            names.append(load_profile(resolve_profile_path(str(spec), [hosts_dir])).name)
        except Exception:
            names.append(Path(str(spec)).stem)
    for index, url in enumerate(option(config, "dflash_attach") or []):
        try:
            names.append(attach_profile(str(url), index).name)
        except Exception:
            continue
    for spec in option(config, "dflash_fleet") or []:
        try:
            names += [profile.name for profile in inventory.load_fleet(str(spec), hosts_dir)]
        except Exception:
            continue
    return [name for name in dict.fromkeys(names) if name]
