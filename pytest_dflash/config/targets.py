"""The hosts under test: --host profiles, --attach URLs and --fleet inventories, narrowed by --shard."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dflash.config.options import option
from pytest_dflash.config.profiles import HostProfile, attach_profile, load_profile, resolve_profile_path
from pytest_dflash.errors import InventoryError
from pytest_dflash.fleet import inventory
from pytest_dflash.run.stash import EMPTY_SHARD_KEY


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
        for index, url in enumerate(option(config, "dflash_attach") or []):
            profile = attach_profile(url, index)
            profiles[profile.name] = profile
        for spec in option(config, "dflash_fleet") or []:
            for profile in inventory.load_fleet(str(spec), hosts_dir):
                if profile.name in profiles:
                    raise InventoryError(str(spec), profile.name, "this host name is already used by another profile")
                profiles[profile.name] = profile
    except InventoryError as exc:
        raise pytest.UsageError(str(exc)) from None
    shard = str(option(config, "dflash_shard") or "")
    if shard:
        try:
            index, count = inventory.parse_shard(shard)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        selected = inventory.select_shard(profiles, index, count)
        if profiles and not selected:
            config.stash[EMPTY_SHARD_KEY] = f"shard {index}/{count} holds none of the {len(profiles)} hosts"
        profiles = selected
    return profiles
