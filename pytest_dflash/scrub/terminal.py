"""Server-controlled text made safe to print: for a terminal, and for the CI log the terminal is copied into.

A server's answer, log or error body is text the plugin did not write. Printed raw, ``\\x1b[2J`` clears
the screen, ``\\x1b]0;…\\x07`` sets the window title, a ``\\r`` overwrites what came before it on the line,
and a line ``::error::…`` is a GitHub Actions workflow command (``::add-mask::``, ``::set-output``,
``::stop-commands`` too), as ``##vso[…]`` and ``##[…]`` are Azure Pipelines' (read anywhere in a line).
:func:`terminal_safe` writes each control character other than newline and tab (C0, DEL, C1) as its
Python escape (``\\x1b``, ``\\r``, ``\\x07``) and the first character of each workflow-command prefix the
same way (``\\x3a:error::…``, ``\\x23#vso[…``): every byte is still visible, none acts. It is idempotent,
and the text comes back unchanged (the same object) when there is nothing to escape.

`scrub/bounds.py::scrub` applies it to every text it bounds (report sections, failure texts, summaries,
progress lines, the verdict's strings); the outputs written outside it (the GitHub step summary, the fleet
HTML and JUnit) call it themselves.
"""

from __future__ import annotations

import re

__all__ = ["terminal_safe"]

# C0 controls but \t (0x09) and \n (0x0a), DEL, C1 controls.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# GitHub Actions reads `::name…::` at the start of a line after whitespace (the runner trims it); Azure
# Pipelines reads `##vso[` anywhere in a line, and the `##[group]`-style formatting commands GitHub's runner
# also still accepts.
# (Whitespace of the line only, never a newline: `^\s*` rescans every run of blank lines from each of its
# starts, quadratic in a log of empty lines.)
_COMMAND = re.compile(r"^([^\S\n]*):(?=:)|#(?=#(?:vso)?\[)", re.MULTILINE)
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]|^[^\S\n]*::|##(?:vso)?\[", re.MULTILINE)


def _escape(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]


def _defuse(match: re.Match[str]) -> str:
    if match.group(1) is not None:
        return f"{match.group(1)}\\x3a"
    return "\\x23"


def terminal_safe(text: str) -> str:
    """`text` with every control character but newline and tab escaped (``\\x1b``, ``\\r``, ``\\x9b``) and no
    line that a CI runner would take for a workflow command."""
    if not _UNSAFE.search(text):
        return text
    return _COMMAND.sub(_defuse, _CONTROL.sub(_escape, text))
