"""Server-controlled text as the plugin prints it: no control character acts on the terminal, no line is a CI
workflow command, and every byte of it is still there to read."""

from __future__ import annotations

import re
import time

import pytest

from pytest_dflash.scrub.bounds import scrub
from pytest_dflash.scrub.terminal import terminal_safe

HOSTILE = "\x1b[2J\x1b]0;PWNED\x07 Internal error\r\n::error::injected\n  ::add-mask::x\n##vso[task.setvariable]y"
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@pytest.mark.parametrize(("text", "safe"), [
    ("\x1b[2Jcleared", "\\x1b[2Jcleared"),
    ("title\x1b]0;PWNED\x07", "title\\x1b]0;PWNED\\x07"),
    ("progress 10%\rdone", "progress 10%\\rdone"),
    ("nul\x00 del\x7f csi\x9b nel\x85", "nul\\x00 del\\x7f csi\\x9b nel\\x85"),
    ("a\tb\nc", "a\tb\nc"),  # tabs and line breaks are layout, not commands
    ("::error::injected", "\\x3a:error::injected"),
    ("ok\n   ::set-output name=x::1", "ok\n   \\x3a:set-output name=x::1"),
    ("\r::warning::x", "\\r::warning::x"),  # the escaped CR is no whitespace the runner trims
    ("log ##vso[task.complete result=Failed]", "log \\x23#vso[task.complete result=Failed]"),
    ("##[error]boom", "\\x23#[error]boom"),
    ("suites/smoke/test_x.py::test_y failed", "suites/smoke/test_x.py::test_y failed"),  # a node id mid-line
    ("café 😀 ünïcode", "café 😀 ünïcode"),
])
def test_terminal_safe(text: str, safe: str) -> None:
    assert terminal_safe(text) == safe


def test_terminal_safe_is_idempotent_and_keeps_clean_text_as_it_is() -> None:
    once = terminal_safe(HOSTILE)
    assert terminal_safe(once) == once
    clean = "[dflash] sm120/dflash: ready in 41.2s"
    assert terminal_safe(clean) is clean


def test_scrub_makes_every_bounded_text_terminal_safe() -> None:
    out = scrub(HOSTILE * 500, 4096, "report section")
    assert not RAW.search(out)
    assert not any(line.lstrip().startswith("::") for line in out.splitlines())
    assert "##vso[" not in out
    assert "PWNED" in out and len(out.encode()) <= 4096


@pytest.mark.parametrize("keep", ["tail", "both"])
def test_a_cut_inside_a_line_never_starts_a_workflow_command(keep: str) -> None:
    for after in range(400, 1100):  # the cut sweeps over the "::" (the tail keeps ~500 or ~1000 bytes)
        text = "first line\n" + "x" * 3000 + "ab::error::injected" + "y" * after
        out = scrub(text, 1024, "log tail", keep=keep)  # type: ignore[arg-type]
        assert len(out.encode()) <= 1024
        assert not any(line.lstrip().startswith("::") for line in out.splitlines()), out


def test_a_log_of_blank_lines_is_made_safe_in_linear_time() -> None:
    started = time.monotonic()
    assert terminal_safe("\n" * 200_000 + " \t::error::x") == "\n" * 200_000 + " \t\\x3a:error::x"
    assert time.monotonic() - started < 1.0  # `^\s*` took 1.7 s for 50,000 blank lines
