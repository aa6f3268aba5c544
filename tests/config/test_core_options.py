"""The core options (--journal-lines, --ready-timeout, --lock-wait, --request-timeout) go through the same
validators as every other option: defaults, ini keys, and bad values as one line naming the flag and ini key."""

from __future__ import annotations

import pytest

from pytest_dflash.plugin import RUN_KEY


def test_defaults(pytester: pytest.Pytester) -> None:
    options = pytester.parseconfigure().stash[RUN_KEY].options
    assert (options.journal_lines, options.ready_timeout_s, options.lock_wait_s, options.request_timeout_s) == (
        200, None, 600.0, 60.0)


def test_flags_and_ini_keys(pytester: pytest.Pytester) -> None:
    options = pytester.parseconfigure("--journal-lines", "50", "--ready-timeout", "15m", "--lock-wait", "0",
                                      "--request-timeout", "2s").stash[RUN_KEY].options
    assert (options.journal_lines, options.ready_timeout_s, options.lock_wait_s, options.request_timeout_s) == (
        50, 900.0, 0.0, 2.0)  # --lock-wait 0: fail at once when another run holds the host
    pytester.makeini("[pytest]\ndflash_journal_lines = 7\ndflash_lock_wait = 30s\n")
    options = pytester.parseconfigure().stash[RUN_KEY].options
    assert (options.journal_lines, options.lock_wait_s) == (7, 30.0)


@pytest.mark.parametrize(("args", "message"), [
    (["--journal-lines", "many"], "--journal-lines / dflash_journal_lines: 'many' is not an integer"),
    (["--journal-lines", "-1"], "--journal-lines / dflash_journal_lines: '-1' must be >= 0"),
    (["--ready-timeout", "0"], "--ready-timeout / dflash_ready_timeout: '0' must be > 0"),
    (["--request-timeout", "0s"], "--request-timeout / dflash_request_timeout: '0s' must be > 0"),
    (["--lock-wait", "soon"], "--lock-wait / dflash_lock_wait"),
])
def test_bad_values_name_their_flag(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message):
        pytester.parseconfigure(*args)


@pytest.mark.parametrize(("args", "message"), [
    (["--ready-timeout", "99999999999999999999h"],
     r"--ready-timeout / dflash_ready_timeout: '99999999999999999999h' is longer than the maximum, 7 days"),
    (["--lock-wait", "169h"], r"--lock-wait / dflash_lock_wait: '169h' is longer than the maximum, 7 days"),
    (["--request-timeout", "604801"], r"--request-timeout / dflash_request_timeout: '604801' is longer than"),
    (["--kernels-timeout", "10081m"], r"--kernels-timeout / dflash_kernels_timeout: '10081m' is longer than"),
    (["--parity-tie-gap", "nan"], r"--parity-tie-gap / dflash_parity_tie_gap: 'nan' is not a finite number"),
    (["--dist-alpha", "inf"], r"--dist-alpha / dflash_dist_alpha: 'inf' is not a finite number"),
    (["--ddtree-accept-ratio", "1e999"], r"--ddtree-accept-ratio / dflash_ddtree_accept_ratio: '1e999' is not a "
                                         r"finite number"),
])
def test_durations_past_7_days_and_numbers_that_are_not_finite_are_refused(pytester: pytest.Pytester,
                                                                           args: list[str], message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message):
        pytester.parseconfigure(*args)


def test_seven_days_is_the_longest_option_duration(pytester: pytest.Pytester) -> None:
    options = pytester.parseconfigure("--ready-timeout", "168h", "--lock-wait", "604800").stash[RUN_KEY].options
    assert (options.ready_timeout_s, options.lock_wait_s) == (604800.0, 604800.0)
