"""Every skip of a check is one of two kinds, and only one of them is innocent.

- does not apply (`not_applicable`): the profile or the run rules the check out (a plain service has no
  speculation; a host attached by URL has no host access; an option left off). A pass may stand beside it.
- could not check (`could_not_check`): the check applies but could not be made: the server did not answer
  what it should, or a capability the profile declares (or discovery found) is missing. Never a pass: the
  host's verdict is at best partial and a --gate over the layer fails, naming the reason
  (report/verdict.py reads `is_unchecked`).

The kind travels in the skip reason itself (a prefix, as run/blocking.py's "blocked: " does), so it survives
xdist's worker -> controller serialisation and reaches every report that quotes the reason. The checks in
pytest_dflash/layers and the suites skip only through this module (tests/run/test_skips.py walks them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from pytest_dflash.run.state import ServiceHandle

UNCHECKED_PREFIX = "could not check: "
NOT_APPLICABLE = "does not apply"
UNCHECKED = "could not check"


def not_applicable(reason: str) -> NoReturn:
    """Skip: the check does not apply to this host or service (innocent)."""
    __tracebackhide__ = True
    pytest.skip(reason)


def could_not_check(reason: str) -> NoReturn:
    """Skip: the check applies but could not be made (never a pass: partial at best, a gate fails)."""
    __tracebackhide__ = True
    pytest.skip(UNCHECKED_PREFIX + reason)


def is_unchecked(skip_message: str) -> bool:
    """Was this skip a 'could not check' (read from the reason, as any report carries it)?"""
    return skip_message.startswith(UNCHECKED_PREFIX)


def kind(skip_message: str) -> str:
    """The kind of a skip, from its reason: UNCHECKED or NOT_APPLICABLE (also any skip made elsewhere)."""
    return UNCHECKED if is_unchecked(skip_message) else NOT_APPLICABLE


def sglang_expected(service: ServiceHandle) -> str | None:
    """Why `service` should speak SGLang's native API although it does not now (None: nothing says it
    should): its /server_info failed with something other than "not served", or the profile or discovery
    knows it to be speculative (only SGLang serves that here)."""
    if service.server_info_error is not None:
        return f"/server_info could not be read: {service.server_info_error}"
    if service.spec.speculative:
        return (f"its algorithm is {service.spec.algorithm} (profile or discovery) and it does not serve "
                "SGLang's /server_info")
    return None


def needs_sglang(service: ServiceHandle, what: str) -> None:
    """Skip unless `service` speaks SGLang's native API (/server_info, /generate meta_info): 'could not
    check' when it should (`sglang_expected`), else 'does not apply' (a server that is not SGLang)."""
    __tracebackhide__ = True
    if service.native:
        return
    if expected := sglang_expected(service):
        could_not_check(f"{service.label}: {what}, but {expected}")
    not_applicable(f"{what} (not an SGLang server)")


__all__ = ["NOT_APPLICABLE", "UNCHECKED", "UNCHECKED_PREFIX", "could_not_check", "is_unchecked", "kind",
           "needs_sglang", "not_applicable", "sglang_expected"]
