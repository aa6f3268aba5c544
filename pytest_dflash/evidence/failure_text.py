"""A failure's text, in the order an on-call reader needs it: the diagnosis and its remedy first (the line
pytest's short summary, JUnit's message= and the verdict quote), then the symptom (the exception and its
message), then where in the test it was raised; the service log once, in its own report section (not again
as a tail in the text). A test's own `assert` keeps pytest's explanation, its fixtures shown short."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_dflash.errors import DflashError
from pytest_dflash.evidence.diagnosis import Diagnosis
from pytest_dflash.scrub.bounds import LINE_BYTES, failure_text, scrub

__all__ = ["Symptom", "drop_log_tail", "first_line", "lead_with", "reads_as_diagnosis",
           "short_fixture_values", "symptom"]

LOG_TAIL_MARK = "--- last lines of the service log ---"
DIAGNOSED = re.compile(r"\[[a-z0-9-]+\] \S")  # '[curand-header-missing] the CUDA toolkit …'

_PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Symptom:
    """What the test saw: 'ExcType: message', the end of the service log its error carried, where it was
    raised."""

    message: str
    tail: str = ""
    where: str = ""

    def text(self, *, tail: bool = True) -> str:
        return "\n".join(part for part in (self.message, self.tail if tail else "", self.where) if part)


def reads_as_diagnosis(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    """A service/transport/API failure, or a check of the plugin's that failed (an AssertionError raised
    inside pytest_dflash: its message is the evidence). Not a test's own `assert` (pytest's explanation of it
    is the point) and not a bug of the plugin (its traceback is)."""
    if isinstance(excinfo.value, DflashError):
        return True
    if not isinstance(excinfo.value, AssertionError) or not excinfo.traceback:
        return False
    return Path(str(excinfo.traceback[-1].path)).resolve().is_relative_to(_PACKAGE)


def symptom(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> Symptom:
    """The exception and its message, the log tail it carried, then where in the test it was raised; no
    traceback through the plugin, no repr of its fixtures."""
    where = ""
    path = str(getattr(item, "path", ""))
    for entry in reversed(excinfo.traceback):
        if str(entry.path) == path:
            where = f"(raised at {item.location[0]}:{entry.lineno + 1}, in {item.name})"
            break
    message, mark, tail = failure_text(excinfo.value).partition(f"\n{LOG_TAIL_MARK}\n")
    # a check that already leads with its diagnosis (layers/gpu/report.py `explain`: '[id] title', its remedy)
    # keeps it first, not behind the exception's type
    said = message if DIAGNOSED.match(message) else f"{type(excinfo.value).__name__}: {message}"
    return Symptom(said, f"{LOG_TAIL_MARK}\n{tail}" if mark else "", where)


def drop_log_tail(text: str) -> str:
    """A failure text without the service log's tail it carried (`failure_text`): shown in its own section."""
    head, mark, rest = text.partition(f"\n{LOG_TAIL_MARK}\n")
    if not mark:
        return text
    after = [line for line in rest.splitlines() if line.startswith("(raised at ")]
    return "\n".join([head, *after])


def lead_with(diagnosis: Diagnosis | None, body: str) -> str:
    """The failure text with the diagnosis and its remedy as its first line (`Diagnosis.headline`)."""
    return f"{diagnosis.headline()}\n{body}" if diagnosis is not None else body


def short_fixture_values(item: pytest.Item, report: pytest.TestReport,
                          excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """A test's own failing `assert` keeps pytest's traceback and explanation, but the arguments and locals it
    lists show the plugin's fixtures as what they are (`<ServiceHandle gpu7/dflash>`), not as dataclass dumps
    with thread events and addresses."""
    funcargs = getattr(item, "funcargs", {})
    values = {name: value for name, value in funcargs.items() if name.startswith("dflash_")}
    if not values:
        return
    kinds = tuple({type(v) for value in values.values()
                   for v in (value if isinstance(value, tuple) else (value,))})
    frames: dict[str, object] = {}  # the locals of the failing frames that hold one of those objects
    for entry in excinfo.traceback:
        with contextlib.suppress(Exception):
            frames.update((k, v) for k, v in entry.locals.items() if isinstance(v, kinds))
    short = {name: _short_value(value) for name, value in values.items()}
    for reprtraceback, _, _ in getattr(report.longrepr, "chain", None) or ():
        for entry in getattr(reprtraceback, "reprentries", ()):
            reprfuncargs = getattr(entry, "reprfuncargs", None)
            if reprfuncargs is not None:
                reprfuncargs.args = [(name, short.get(name, value)) for name, value in reprfuncargs.args]
            reprlocals = getattr(entry, "reprlocals", None)
            if reprlocals is not None:  # --showlocals: "name       = value" lines
                lines = []
                for line in reprlocals.lines:
                    name = line.split(" ", 1)[0]
                    value = short.get(name) or (_short_value(frames[name]) if name in frames else None)
                    lines.append(f"{name:<10} = {value}" if value else line)
                reprlocals.lines = lines


def _short_value(value: object) -> str:
    if isinstance(value, tuple):
        return f"({', '.join(_short_value(v) for v in value)})"
    label = getattr(value, "label", None) or getattr(value, "name", None)
    return f"<{type(value).__name__}{f' {label}' if isinstance(label, str) else ''}>"


def first_line(text: str, longrepr: object = None) -> str:
    """What a summary shows of a failure: pytest's crash line ('ExcType: message', the exception's own words)
    when the report has one, else the assertion's first line ('E ...': a traceback kept as text, e.g. once
    capped), else a plain-text failure's first line, else the last line. Never the log tail an exception's
    message carries after its first line."""
    crash = getattr(longrepr, "reprcrash", None)
    message = str(getattr(crash, "message", "") or "").strip()
    if message:
        return scrub(message.splitlines()[0], LINE_BYTES, "summary")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("E "):
            return scrub(line[2:].strip(), LINE_BYTES, "summary")
    if isinstance(longrepr, str) and longrepr.strip():
        # a plain-text failure (the exception and its message first, or a pytest.fail message):
        # its own first line, not the text's (under xdist, the worker's "[gw0] linux -- …" line)
        return scrub(longrepr.strip().splitlines()[0], LINE_BYTES, "summary")
    return scrub((text.strip().splitlines() or [""])[-1], LINE_BYTES, "summary")
