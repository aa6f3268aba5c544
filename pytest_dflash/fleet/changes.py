"""What of a host's services "what changed" compares (fleet/trend.py::what_changed).

A service that came up in both verdicts is compared by what it served (/server_info: algorithm, version,
speculation …). One that never came up served nothing: listing each served key as "→ absent" hides the real
change, so then only how the profile said to run it is compared (its `configured` facts: kind, unit, template,
image, environment, and the command flag by flag, `--speculative-num-draft-tokens: 8 → 6`), and what could not
be compared is said."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_dflash.fleet.values import flatten

# Service facts that are measurements of one run, not configuration: never "what changed".
VOLATILE_SERVICE_KEYS = frozenset({"ready", "stopped", "accept_length", "provisioned", "ready_s",
                                   "configured", "server_info_error"})


def command_flags(argv: Sequence[str]) -> dict[str, str]:
    """A command line as {flag: value}: '--tp-size 2' and '--tp-size=2' -> {'--tp-size': '2'}, a flag with
    no value -> 'on', the words before the first flag -> {'program': …}, a later bare word -> {'argN': …}."""
    out: dict[str, str] = {}
    words: list[str] = []
    flag: str | None = None
    for index, token in enumerate(argv):
        if token.startswith("-") and len(token) > 1 and not _number(token):
            if flag is not None:
                out[flag] = "on"
            name, eq, value = token.partition("=")
            flag = None if eq else name
            if eq:
                out[name] = value
        elif flag is not None:
            out[flag], flag = token, None
        elif not out:
            words.append(token)
        else:
            out[f"arg{index}"] = token
    if flag is not None:
        out[flag] = "on"
    if words:
        out = {"program": " ".join(words), **out}
    return out


def _number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def came_up(facts: Mapping[str, Any]) -> bool:
    """Did the service become ready in that run (so what it served is on record)?"""
    return isinstance(facts.get("ready"), Mapping)


def configured_keys(name: str, facts: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's view of one service as flat keys: `services.<svc>.command --flag` per command flag."""
    configured = facts.get("configured")
    if not isinstance(configured, Mapping):
        return {}
    out = {f"services.{name}.{key}": value
           for key, value in flatten({k: v for k, v in configured.items() if k != "command"}).items()}
    command = configured.get("command")
    if isinstance(command, list):
        out |= {f"services.{name}.command {flag}": value
                for flag, value in command_flags([str(t) for t in command]).items()}
    return out


def served_keys(name: str, facts: Mapping[str, Any]) -> dict[str, Any]:
    """What one service served, as flat keys (its URL and launch command left out when provisioned: those
    carry a free port that differs every run)."""
    out: dict[str, Any] = {}
    for key, value in flatten({k: v for k, v in facts.items() if k not in VOLATILE_SERVICE_KEYS}).items():
        if key in ("url", "launch_command") and facts.get("provisioned"):
            continue
        out[f"services.{name}.{key}"] = value
    return out


def service_changes(good: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[list[dict[str, Any]],
                                                                                  list[str]]:
    """The services' changes ({category, key, before, after}) and what could not be compared."""
    before = {n: f for n, f in (good.get("services") or {}).items() if isinstance(f, Mapping)}
    after = {n: f for n, f in (current.get("services") or {}).items() if isinstance(f, Mapping)}
    changes: list[dict[str, Any]] = []
    not_compared: list[str] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name, {}), after.get(name, {})
        old_keys, new_keys = configured_keys(name, old), configured_keys(name, new)
        if name in before and name in after and bool(old_keys) != bool(new_keys):
            side = "the last good verdict" if not old_keys else "this verdict"
            not_compared.append(f"{name}: {side} does not record the profile's command for it")
            old_keys = new_keys = {}
        if came_up(old) == came_up(new) or name not in before or name not in after:
            old_keys |= served_keys(name, old)
            new_keys |= served_keys(name, new)
        else:
            run = "this run" if not came_up(new) else "the last good run"
            not_compared.append(f"{name} never came up in {run}: what it served (/server_info: algorithm, "
                                "version, speculation) was not compared, only how the profile ran it")
        for key in sorted(set(old_keys) | set(new_keys)):
            if old_keys.get(key) != new_keys.get(key):
                category = "unit" if ".command " in key or key.endswith((".unit", ".template")) else "service"
                changes.append({"category": category, "key": key, "before": old_keys.get(key),
                                "after": new_keys.get(key)})
    # the command first: when a service never came up, that is the change to read
    changes.sort(key=lambda c: c["category"] != "unit")
    return changes, not_compared
