"""What a terminal shows for the bytes a run wrote to it (tests/report: the live progress line)."""

from __future__ import annotations

import re


def render(raw: bytes, width: int = 120) -> list[str]:
    """The screen a terminal shows for `raw`, for the few controls pytest and the progress writer send (CR, LF,
    erase to end of line, cursor up, cursor to column; colours dropped): what a person reads once it is done."""
    rows: list[list[str]] = [[]]
    row = column = 0
    for token in re.findall(r"\x1b\[[0-9;]*[A-Za-z]|[\r\n]|[^\x1b\r\n]", raw.decode(errors="replace")):
        if token == "\r":
            column = 0
        elif token == "\n":
            row += 1
        elif token.startswith("\x1b["):
            number = int(token[2:-1].split(";")[0] or 1) if token[-1] in "AG" else 0
            if token[-1] == "K":
                del rows[row][column:]
            elif token[-1] == "A":
                row = max(row - number, 0)
            elif token[-1] == "G":
                column = number - 1
            continue
        else:
            if column >= width:
                row, column = row + 1, 0
            while len(rows) <= row:
                rows.append([])
            line = rows[row]
            line.extend(" " * max(column + 1 - len(line), 0))
            line[column] = token
            column += 1
        while len(rows) <= row:
            rows.append([])
    return ["".join(line).rstrip() for line in rows]
