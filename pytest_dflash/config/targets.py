"""The hosts under test: --host profiles, --attach URLs (named host:port) and --fleet inventories, narrowed by
--shard, one host per name; and a host's or a service's name as a file name (`file_name`, `service_file_name`:
injective)."""

from __future__ import annotations

import dataclasses
import hashlib
import string
from pathlib import Path

import pytest

from pytest_dflash.config import inventory
from pytest_dflash.config.loader import attach_profile, error_line, load_profile, resolve_profile_path
from pytest_dflash.config.options import option
from pytest_dflash.config.profiles import ALGORITHMS, HostProfile
from pytest_dflash.errors import InventoryError

# the run's profiles, loaded first (report/started.py)
TARGETS_KEY = pytest.StashKey[dict[str, HostProfile]]()
NAMED_HOSTS_KEY = pytest.StashKey[tuple[str, ...]]()  # every host the run names, before --shard
EMPTY_SHARD_KEY = pytest.StashKey[str]()
# A host's file name keeps these as they are; ":" (an attached server's host:port) becomes "_"; anything else,
# "_" itself included, is percent-escaped (its UTF-8 bytes), so two names never share a file.
_KEPT = frozenset(string.ascii_letters + string.digits + ".-")
# A service's file name keeps "_" too (no ":" is mapped to it): a name a profile may give a service is kept.
_KEPT_FOR_SERVICES = _KEPT | {"_"}
_MAX_FILE_NAME = 180  # bytes: room for ".verdict.json" and the like under the usual 255


def file_name(host: str) -> str:
    """A host's name as a file or folder name (its verdict file, history and perf folders, HTML anchor).
    Injective: `alpha beta` -> `alpha%20beta`, `alpha:beta` -> `alpha_beta`, `alpha_beta` -> `alpha%5Fbeta`;
    a leading "." is escaped (no `..` folder). A name longer than 180 bytes when escaped keeps its first 160
    and a hash of the whole name after `%~` (a sequence no escaped name contains)."""
    return _escaped(host, _KEPT, colon="_")


def service_file_name(service: str) -> str:
    """A service's name as a file name (its perf JSON and plots, its perf baseline), injective as `file_name`
    is, and unchanged for every name a profile may give a service (letters, digits, `_`, `-`, `.`; so a
    baseline recorded before keeps its file): `a b` -> `a%20b`, `a:b` -> `a%3Ab`, `a/b` -> `a%2Fb`, `a_b` ->
    `a_b`."""
    return _escaped(service, _KEPT_FOR_SERVICES, colon=None)


def _escaped(name: str, kept: frozenset[str], *, colon: str | None) -> str:
    """`name` with every character outside `kept` (and a leading ".") percent-escaped, its UTF-8 bytes as %XX;
    ":" written as `colon` instead when that is given (`colon` must not be in `kept`)."""
    parts: list[str] = []
    for index, char in enumerate(name):
        if char in kept and not (index == 0 and char == "."):
            parts.append(char)
        elif char == ":" and colon is not None:
            parts.append(colon)
        else:
            parts.extend(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    escaped = "".join(parts)
    if len(escaped) > _MAX_FILE_NAME:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        cut = escaped[:160]
        if (escape := cut.rfind("%", len(cut) - 2)) >= 0:
            cut = cut[:escape]  # not half an escape
        escaped = cut + "%~" + digest
    return escaped


def load_targets(config: pytest.Config) -> dict[str, HostProfile]:
    """Every profile the options name, validated (a bad one is a one-line UsageError, exit 4)."""
    hosts_dir = Path(str(option(config, "dflash_hosts_dir")))
    if not hosts_dir.is_absolute():
        hosts_dir = (config.invocation_params.dir / hosts_dir).resolve()
    profiles: dict[str, HostProfile] = {}
    try:
        for spec in option(config, "dflash_hosts") or []:
            _add(profiles, load_profile(resolve_profile_path(spec, [hosts_dir])), f"--host {spec}")
        urls = list(option(config, "dflash_attach") or [])
        log_commands = attach_log_commands(config, len(urls))
        algorithms = attach_algorithms(config, len(urls))
        for index, url in enumerate(urls):
            profile = with_declared(attach_profile(url), algorithm=algorithms[index],
                                    log_command=log_commands[index])
            _add(profiles, profile, f"--attach {profile.services['attached'].display_url}")
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


def _add(profiles: dict[str, HostProfile], profile: HostProfile, given: str) -> None:
    """One host per name: the same profile given twice (the same file, the same URL) counts once; two
    different ones of one name would write one verdict file and one history: a usage error naming both."""
    known = profiles.get(profile.name)
    if known is not None and known != profile:
        raise pytest.UsageError(f"{given}: host {profile.name!r} is already {_given(known)}; two hosts need "
                                "two names (an attached server is named by its host:port)")
    profiles[profile.name] = profile


def _given(profile: HostProfile) -> str:
    if profile.connection is None and "attached" in profile.services:
        return f"--attach {profile.services['attached'].display_url}"
    return f"the profile {profile.source}"


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


def attach_algorithms(config: pytest.Config, attached: int) -> list[str | None]:
    """--attach-algorithm: one of ALGORITHMS, for every --attach or one per --attach in order (None: read from
    /server_info, run/discovery.py)."""
    where = "--attach-algorithm / dflash_attach_algorithm"
    raw = option(config, "dflash_attach_algorithm") or []
    given = [str(a).strip().upper() for a in raw if str(a).strip()]
    if not given:
        return [None] * attached
    if not attached:
        raise pytest.UsageError(f"{where}: needs --attach URL")
    for algorithm in given:
        if algorithm not in ALGORITHMS:
            raise pytest.UsageError(f"{where}: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if len(given) == 1:
        return [given[0]] * attached
    if len(given) != attached:
        raise pytest.UsageError(f"{where}: given {len(given)} times for {attached} --attach URLs (give it "
                                "once, or once per --attach)")
    return list(given)


def with_declared(profile: HostProfile, *, algorithm: str | None, log_command: str | None) -> HostProfile:
    """An --attach profile whose service is declared to serve `algorithm` (None: left to discovery) and reads
    its log with `log_command` (run on this machine, read-only; None: no log)."""
    if algorithm is None and log_command is None:
        return profile
    services = {name: dataclasses.replace(
        spec, algorithm=spec.algorithm if algorithm is None else algorithm,
        log_command=spec.log_command if log_command is None else log_command)
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
    for url in option(config, "dflash_attach") or []:
        try:
            names.append(attach_profile(str(url)).name)
        except Exception:
            continue
    for spec in option(config, "dflash_fleet") or []:
        try:
            names += [profile.name for profile in inventory.load_fleet(str(spec), hosts_dir)]
        except Exception:
            continue
    return [name for name in dict.fromkeys(names) if name]
