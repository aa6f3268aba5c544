"""run/cleanup.py: an interrupt pytest handled must not turn the exit status into 'killed by SIGINT'."""

from __future__ import annotations

import subprocess
import sys

import pytest

CAUGHT = 'try:\n    exec("raise KeyboardInterrupt")\nexcept KeyboardInterrupt:\n    pass\n'


def exit_status(script: str) -> int:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60).returncode


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="gh-128130: 3.14 no longer keeps the mark")
def test_a_caught_interrupt_from_exec_code_still_kills_the_interpreter_by_sigint() -> None:
    # The CPython behaviour behind the flaky 'returncode -2 instead of 2' of an interrupted run.
    assert exit_status(CAUGHT) == -2


def test_forget_handled_interrupt_gives_the_normal_exit_status_back() -> None:
    script = CAUGHT + "from pytest_dflash.run.cleanup import forget_handled_interrupt\nforget_handled_interrupt()\n"
    assert exit_status(script) == 0
    assert exit_status(script + "raise SystemExit(2)\n") == 2
