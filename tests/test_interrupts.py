"""pytest_dflash/interrupts.py: a Ctrl-C that a finalizer swallows is latched and raised again.

Each case runs in its own interpreter: signal handlers are process-wide and the latch is module state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A finalizer that is running when SIGINT is handled: Python raises KeyboardInterrupt inside it, prints
# "Exception ignored in ..." and drops it.
SWALLOWED = """
import os, signal, time
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs between these bytecodes, inside the finalizer
            pass
Finalized()
"""


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


def test_cpython_drops_a_keyboard_interrupt_raised_in_a_finalizer() -> None:
    # Why the latch exists: without it the program just goes on.
    done = run(SWALLOWED + "print('went on')\n")
    assert done.returncode == 0 and "went on" in done.stdout
    assert "KeyboardInterrupt" in done.stderr and "Exception ignored" in done.stderr


def test_the_latch_keeps_what_the_finalizer_dropped_and_the_next_wait_raises_it() -> None:
    script = ("from pytest_dflash import interrupts\nassert interrupts.install_sigint() is not None\n" + SWALLOWED
              + "assert interrupts.received() == 'SIGINT' and interrupts.lost()\n"
              "try:\n    interrupts.raise_if_lost()\nexcept KeyboardInterrupt as exc:\n    print('raised:', exc)\n"
              "interrupts.mark_delivered()\ninterrupts.raise_if_lost()\nprint('delivered: no more')\n")
    done = run(script)
    assert done.returncode == 0, done.stderr
    assert "raised: SIGINT (raised again: the first one was lost in a finalizer)" in done.stdout
    assert "delivered: no more" in done.stdout


def test_no_signal_no_raise_and_a_users_own_handler_is_left_alone() -> None:
    script = ("import signal\nfrom pytest_dflash import interrupts\ninterrupts.raise_if_lost()\n"
              "assert not interrupts.lost() and interrupts.received() is None\n"
              "def mine(signum, frame):\n    pass\nsignal.signal(signal.SIGINT, mine)\n"
              "assert interrupts.install_sigint() is None and signal.getsignal(signal.SIGINT) is mine\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\nassert interrupts.install_sigint() is None\n")
    done = run(script)
    assert done.returncode == 0, done.stderr


def test_a_signal_during_teardown_is_latched_not_raised_and_later_ones_raise_again() -> None:
    script = ("import os, signal, time\nfrom pytest_dflash import interrupts\ninterrupts.install_sigint()\n"
              "with interrupts.deferred():\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(0.2)\n"
              "assert interrupts.in_teardown() and interrupts.received() == 'SIGINT'\n"
              "interrupts.raise_if_lost()  # teardown is over: nothing to raise again\n"
              "try:\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(5)\n"
              "except KeyboardInterrupt:\n    print('raised after teardown')\n")
    done = run(script)
    assert done.returncode == 0, done.stderr
    assert "raised after teardown" in done.stdout


# A KeyboardInterrupt whose traceback ends on an instruction with no line (CPython 3.11 handles a signal
# between any two instructions, the artificial ones of exception cleanup included): what a clean-clone CI run
# met when SIGTERM arrived, and pytest's printer then crashed on `tb_lineno - 1`.
LINELESS = '''
import sys, types

def cleanup():
    try:
        x = 1
    except ValueError:
        pass
    return sys._getframe()

def lineless_interrupt():
    frame = cleanup()
    offset = next(start for start, _end, line in frame.f_code.co_lines() if line is None)
    inner = types.TracebackType(None, frame, offset, -1)
    assert inner.tb_lineno is None
    try:
        raise KeyboardInterrupt("SIGTERM")
    except KeyboardInterrupt as exc:
        exc.__traceback__.tb_next = inner
        return exc
'''


def test_pytest_cannot_print_a_keyboard_interrupt_whose_entry_has_no_line() -> None:
    # Why mend_traceback exists: this is the TypeError that turned an interrupted run into exit 1.
    done = run(LINELESS + "import pytest\nexc = lineless_interrupt()\n"
               "try:\n    pytest.ExceptionInfo.from_exception(exc).getrepr()\n"
               "except TypeError as err:\n    print('pytest failed:', err)\n")
    assert done.returncode == 0, done.stderr
    assert "pytest failed: unsupported operand" in done.stdout


def test_a_mended_traceback_prints_and_keeps_the_frame_at_the_line_before() -> None:
    done = run(LINELESS + "import pytest\nfrom pytest_dflash import interrupts\nexc = lineless_interrupt()\n"
               "interrupts.mend_traceback(exc)\n"
               "text = str(pytest.ExceptionInfo.from_exception(exc).getrepr())\n"
               "assert '<string>:6: KeyboardInterrupt' in text, text  # cleanup()'s `x = 1`\n"
               "assert exc.__traceback__.tb_next.tb_lineno == 6, exc.__traceback__.tb_next.tb_lineno\n"
               "print('printed')\n")
    assert done.returncode == 0, done.stderr
    assert "printed" in done.stdout


def test_an_interrupt_with_a_lineless_entry_ends_the_run_as_interrupted(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(LINELESS + "\ndef test_x():\n    raise lineless_interrupt()\n")
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path / "test_x.py")]
    without = subprocess.run([*base, "-p", "no:dflash"], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
    assert without.returncode == 1 and "TypeError" in without.stderr  # pytest alone crashes
    done = subprocess.run(base, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "TypeError" not in done.stdout + done.stderr and "KeyboardInterrupt" in done.stdout
