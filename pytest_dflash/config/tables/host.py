"""[host]: how the host is reached (connection, connect timeout), its name, and who commands run as."""

from __future__ import annotations

import re
import unicodedata
import urllib.parse

from pytest_dflash.config.profiles import DEFAULT_CONNECT_TIMEOUT_S
from pytest_dflash.config.tables.reader import Table, parse_url
from pytest_dflash.scrub.redact import redact_url

PROVISION_MODES = ("never", "allowed", "always")
# [host] become_user: a POSIX-ish user name (what `sudo -u` takes), never an option or a shell word
BECOME_USER = r"[A-Za-z_][A-Za-z0-9_.-]{0,31}"


def check_connection(table: Table, raw: str) -> tuple[str, float]:
    expected = "local:// or ssh://[user@]host[:port][?timeout=N]"
    parsed = parse_url(table, "connection", raw, expected)
    if parsed.scheme == "local":
        return "local://", DEFAULT_CONNECT_TIMEOUT_S
    if parsed.scheme not in ("ssh", "paramiko", "safe-ssh"):
        raise table.fail("connection", f"expected {expected}, got {redact_url(raw)!r}")
    if not parsed.hostname:
        raise table.fail("connection", f"expected a host name in {redact_url(raw)!r}")
    try:
        parsed.port  # noqa: B018
    except ValueError:
        raise table.fail("connection", f"expected a numeric ssh port in {redact_url(raw)!r}") from None
    query = urllib.parse.parse_qs(parsed.query)
    timeout = DEFAULT_CONNECT_TIMEOUT_S
    if "timeout" in query:
        try:
            timeout = float(query["timeout"][0])
        except ValueError:
            raise table.fail("connection",
                             f"expected ?timeout=<seconds>, got {query['timeout'][0]!r}") from None
        if not 0 < timeout <= 5:
            raise table.fail("connection", f"connect timeout must be in (0, 5] seconds, got {timeout:g}")
    else:
        sep = "&" if parsed.query else "?"
        raw = f"{raw}{sep}timeout={timeout:g}"
    return raw, timeout


def host_name(host: Table, default: str) -> str:
    """[host] name (default: the file's stem, or the inventory's host name): it names the host in test ids
    (`host/service`), file names and reports, so it is not empty and holds no '/', '\\' or control
    character."""
    given = host.get("name", str)
    name = default if given is None else given
    problem = host_name_problem(name)
    if problem:
        origin = ("" if given is not None
                  else " (the default: the file's or inventory host's name; set [host] name)")
        raise host.fail("name", f"expected a host name {problem}, got {name!r}{origin}")
    return name


def host_name_problem(name: str) -> str | None:
    """Why `name` cannot name a host (None: it can)."""
    if not name.strip():
        return "that is not empty"
    if "/" in name or "\\" in name:
        return "without '/' or '\\' (it is split on '/' in test ids: host/service)"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") for c in name):
        return "without control or invisible characters"
    if name != name.strip():
        return "without leading or trailing spaces"
    return None


def become_user(host: Table) -> str:
    """[host] become_user: a user name (`sudo -n -u NAME`), root unless told."""
    user = host.get("become_user", str, "root")
    assert user is not None
    if not re.fullmatch(BECOME_USER, user):
        raise host.fail("become_user", f"expected a user name (letters, digits, '_', '-', '.'), got {user!r}")
    return user
