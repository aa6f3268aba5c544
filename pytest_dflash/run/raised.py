"""What a check's call really raised, kept beside its report: a plugin or conftest that rewrites the report
of a failing check into a pass (a `pytest_runtest_makereport` wrapper setting `outcome = "passed"`) does not
make a pass of the verdict.

The innermost `pytest_runtest_call` wrapper (`watch_call`, trylast) sees the exception the test function
raised before any other plugin's wrapper can swallow it, and `record` (the plugin's makereport, on the process
that ran the test) writes its one line into the report's `dflash` property, which travels through xdist's
worker -> controller serialisation. report/session.py's `counted` then counts a "passed" report that carries
one as the failure it was.

The same wrapper checks that the call ran the check's function at all: a conftest whose `pytest_pyfunc_call`
answers True for a check (or that replaces its `runtest`) reports a pass the check never made. The function is
wrapped for the call and a call that never entered it fails, as `NeverRan`: no evidence, no pass.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from typing import Any

import pytest

from pytest_dflash.scrub.bounds import clip, scrub

RAISED_KEY = pytest.StashKey[str | None]()
PROPERTY = "raised"  # the key in the report's `dflash` property
_LINE_CHARS = 400
# outcomes that are not failures: a skip (the plugin's own kinds are judged in run/skips.py), an xfail()
_NOT_FAILURES: tuple[type[BaseException], ...] = (pytest.skip.Exception, pytest.xfail.Exception)


class NeverRan(AssertionError):
    """The call of a check ended without running the check's function."""


def _watch_function(item: pytest.Item) -> Callable[[], bool]:
    """Wrap the check's function (a pytest.Function's `obj`) for this call; the returned callable says whether
    it was entered. Other items (no function to wrap) always say yes."""
    if not isinstance(item, pytest.Function):
        return lambda: True
    entered: list[bool] = []
    function = item.obj

    @functools.wraps(function)
    def watched(*args: Any, **kwargs: Any) -> Any:
        entered.append(True)
        return function(*args, **kwargs)

    item.obj = watched
    return lambda: bool(entered)


def watch_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """The body of the plugin's innermost pytest_runtest_call wrapper: remember what the call raised (each
    attempt anew: a rerun that passes leaves nothing behind), and re-raise it unchanged; a call that never ran
    the check's function fails (NeverRan)."""
    item.stash[RAISED_KEY] = None
    original = getattr(item, "obj", None)
    ran = _watch_function(item)
    try:
        result = yield
        if not ran():
            raise NeverRan("the check's function never ran: a plugin or conftest answered its call "
                           "without it (a pytest_pyfunc_call that returned, a runtest replaced), so it has "
                           "no evidence to pass on")
        return result
    except BaseException as exc:
        if not isinstance(exc, _NOT_FAILURES):
            first = (str(exc).strip().splitlines() or [""])[0]
            item.stash[RAISED_KEY] = clip(f"{type(exc).__name__}: {first}" if first else type(exc).__name__,
                                          _LINE_CHARS)
        raise
    finally:
        if isinstance(item, pytest.Function):
            item.obj = original  # the next attempt (a rerun) wraps the function anew


def record(item: pytest.Item, report: pytest.TestReport) -> None:
    """Write the call's exception into the report's `dflash` property (the call phase only)."""
    if report.when != "call":
        return
    raised = item.stash.get(RAISED_KEY, None)
    if raised is None:
        return
    for key, value in report.user_properties:
        if key == "dflash" and isinstance(value, dict):
            value[PROPERTY] = scrub(raised, _LINE_CHARS * 4, "raised")


def forged_pass(report: pytest.TestReport) -> str | None:
    """The exception of a check whose report says it passed although its call raised, else None."""
    if report.when != "call" or not report.passed:
        return None
    for key, value in report.user_properties:
        if key == "dflash" and isinstance(value, dict) and value.get(PROPERTY):
            return str(value[PROPERTY])
    return None
