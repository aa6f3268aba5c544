"""Every skip of a check is one of two kinds, and only one of them is innocent; a skip from anywhere else is a
third kind, never innocent.

- does not apply (`not_applicable`): the profile or the run rules the check out (a plain service has no
  speculation; a host attached by URL has no host access; an option left off). A pass may stand beside it.
- could not check (`could_not_check`): the check applies but could not be made: the server did not answer
  what it should, or a capability the profile declares (or discovery found) is missing. Never a pass: the
  host's verdict is at best partial and a --gate over the layer fails, naming the reason
  (report/verdict.py reads `is_unchecked`).

- skipped from outside the profile (`OUTSIDE`): any other skip of a check: a `pytest.mark.skip` / `skipif`
  that a conftest or a plugin added, a `pytest.skip()` in a fixture or a test that is not the plugin's. Nobody
  said the check does not apply: the host is at best partial and a --gate over the layer fails, naming the
  marker's reason (report/verdict.py).

Where a skip came from is known where it was raised, not read from its text: the two kinds above raise
`ProfileSkip`, and `record_origin` (the plugin's pytest_runtest_makereport, on the process that ran the test)
writes the kind into the report's `dflash` property, which travels through xdist's worker -> controller
serialisation. "could not check" also keeps its prefix in the reason (as run/blocking.py's "blocked: " does),
so every report that quotes the reason says it. The checks in pytest_dflash/layers and the suites skip only
through this module (tests/run/test_skips.py walks them).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

UNCHECKED_PREFIX = "could not check: "
NOT_APPLICABLE = "does not apply"
UNCHECKED = "could not check"
OUTSIDE = "skipped from outside the profile"
KINDS = (NOT_APPLICABLE, UNCHECKED, OUTSIDE)
PACKAGE = Path(__file__).resolve().parents[1]  # pytest_dflash/: the plugin's own code


class ProfileSkip(pytest.skip.Exception):  # type: ignore[name-defined,misc]
    """A skip raised through this module: its kind is set where it is raised."""

    def __init__(self, msg: str, kind: str) -> None:
        super().__init__(msg=msg)
        self.kind = kind


# shown as pytest's own skip ("Skipped: why", whose prefix every report strips), not under this module's name
ProfileSkip.__module__, ProfileSkip.__qualname__ = "builtins", "Skipped"


def not_applicable(reason: str) -> NoReturn:
    """Skip: the check does not apply to this host or service (innocent)."""
    __tracebackhide__ = True
    raise ProfileSkip(reason, NOT_APPLICABLE)


def could_not_check(reason: str) -> NoReturn:
    """Skip: the check applies but could not be made (never a pass: partial at best, a gate fails)."""
    __tracebackhide__ = True
    raise ProfileSkip(UNCHECKED_PREFIX + reason, UNCHECKED)


def origin(exc: BaseException | None, message: str, own_reasons: Iterable[str] = (),
           test_file: Path | None = None) -> str:
    """The kind of a skip from what raised it: a `ProfileSkip` says its own; a reason among `own_reasons` (the
    plugin's own skip markers on the test, run/collection.py's `does_not_apply`) does not apply; anything
    else was skipped from outside the profile. Given the test's file, "does not apply" is said only by the
    check itself or the plugin: a conftest or plugin that calls `not_applicable` is a skip from outside."""
    if isinstance(exc, ProfileSkip):
        if exc.kind == NOT_APPLICABLE and test_file is not None and not _said_by(exc, test_file):
            return OUTSIDE
        return exc.kind
    return NOT_APPLICABLE if message in set(own_reasons) else OUTSIDE


def _said_by(exc: BaseException, test_file: Path) -> bool:
    """Whether the code that called into this module to raise `exc` is the test's file or pytest-dflash."""
    frames = [tb.tb_frame.f_code.co_filename for tb in _tracebacks(exc)]
    here = str(Path(__file__).resolve())
    while frames and str(Path(frames[-1]).resolve()) == here:
        frames.pop()  # not_applicable itself, and needs_sglang that calls it
    if not frames:
        return True  # no caller recorded: nothing says it came from elsewhere
    caller = Path(frames[-1]).resolve()
    return caller == test_file.resolve() or PACKAGE in caller.parents


def _tracebacks(exc: BaseException) -> Iterable[TracebackType]:
    tb = exc.__traceback__
    while tb is not None:
        yield tb
        tb = tb.tb_next


def record_origin(item: pytest.Item, call: pytest.CallInfo[Any], report: pytest.TestReport) -> None:
    """Write where a skip of a dflash test came from into its report's `dflash` property (`skip`), on the
    process that ran it: the kind then reaches the controller's verdict under xdist as every other field
    does."""
    if not report.skipped or report.when not in ("setup", "call") or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    message = str(longrepr[2]).removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)
    callspec = getattr(item, "callspec", None)
    own = [str(mark.kwargs.get("reason", "")) for mark in getattr(callspec, "marks", ())
           if mark.name == "skip"]
    raised = call.excinfo.value if call.excinfo is not None else None
    found = origin(raised, message, own, Path(str(item.path)))
    for key, value in report.user_properties:
        if key == "dflash" and isinstance(value, dict):
            value["skip"] = found


def is_unchecked(skip_message: str) -> bool:
    """Was this skip a 'could not check' (read from the reason, as any report carries it)?"""
    return skip_message.startswith(UNCHECKED_PREFIX)


def kind(skip_message: str, recorded: object = None) -> str:
    """The kind of a skip: the one `record_origin` recorded, else read from its reason (UNCHECKED or
    NOT_APPLICABLE: a report that carries no recorded kind was made without the plugin's makereport)."""
    if recorded in KINDS:
        return str(recorded)
    return UNCHECKED if is_unchecked(skip_message) else NOT_APPLICABLE


def sglang_expected(service: ServiceHandle) -> str | None:
    """Why `service` should speak SGLang's native API although it does not now (None: nothing says it
    should): its /server_info failed with something other than "not served", or the profile or discovery
    knows it to be speculative (only SGLang serves that here)."""
    if service.server_info_error is not None:
        return f"/server_info could not be read: {service.server_info_error}"
    if service.spec.speculative:
        # a gateway that routes only the OpenAI API hides SGLang: the declaration says what is behind it
        where = ("--attach-algorithm" if str(service.host.profile.source) == "--attach"
                 else f"the profile {service.host.profile.source}")
        return (f"it is declared {service.spec.algorithm} ({where}) and answers no /server_info: attach to "
                "the SGLang server itself, not a gateway in front of it")
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


__all__ = ["KINDS", "NOT_APPLICABLE", "OUTSIDE", "UNCHECKED", "UNCHECKED_PREFIX", "ProfileSkip",
           "could_not_check", "is_unchecked", "kind", "needs_sglang", "not_applicable", "origin",
           "record_origin", "sglang_expected"]
