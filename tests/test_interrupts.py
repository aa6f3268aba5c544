"""pytest_dflash/interrupts.py: a Ctrl-C that a finalizer swallows is latched and raised again.

Each case runs in its own interpreter: signal handlers are process-wide and the latch is module state."""

from __future__ import annotations

import subprocess
import sys

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
