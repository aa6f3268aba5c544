"""Every report leaves bounded and redacted (scrub/bounds.py): its failure text to LONGREPR_BYTES, a skip's
reason to ITEM_BYTES, each section to its own cap and all of them within what the test may still carry
(TEST_BYTES), and the `dflash` property within PROPERTY_BYTES as JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_dflash.scrub.bounds import (
    ITEM_BYTES,
    LOG_BYTES,
    LONGREPR_BYTES,
    PROPERTY_BYTES,
    TEST_BYTES,
    Keep,
    bound_obj,
    human,
    nbytes,
    scrub,
)

__all__ = ["bound_longrepr", "bound_sections", "bounded_info", "json_size"]


def bound_longrepr(report: pytest.TestReport, secrets: tuple[str, ...]) -> None:
    """A failure's text redacted and cut to LONGREPR_BYTES (head: the assertion; tail: where it failed);
    a skip's reason to ITEM_BYTES. The report keeps pytest's own object when nothing had to change."""
    longrepr = report.longrepr
    if longrepr is None:
        return
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, lineno, message = longrepr
        clean = scrub(str(message), ITEM_BYTES, "skip reason", extra=secrets)
        if clean != message:
            report.longrepr = (path, lineno, clean)
        return
    text = report.longreprtext
    clean = scrub(text, LONGREPR_BYTES, "failure text", extra=secrets)
    if clean != text:
        report.longrepr = clean


def _section_limit(title: str) -> tuple[int, int, str, Keep]:
    """(priority, limit, what, keep) of a report section: the diagnosis first, captured output last."""
    if title == "dflash diagnosis":
        return 0, ITEM_BYTES, "diagnosis", "both"
    if title.startswith(("log ", "journal ")):
        return 1, LOG_BYTES, "log tail", "tail"
    if title.startswith("kernel log"):
        return 2, ITEM_BYTES, "kernel log excerpt", "tail"
    if title.startswith("Captured "):
        return 3, ITEM_BYTES, "captured output", "both"
    return 2, ITEM_BYTES, "report section", "both"


def bound_sections(report: pytest.TestReport, secrets: tuple[str, ...], budget: int) -> None:
    """Each section redacted and capped; together within `budget` (what the test may still carry), spent on
    the diagnosis and the logs before captured output."""
    sections = list(report.sections)
    if not sections:
        return
    order = sorted(range(len(sections)), key=lambda i: _section_limit(sections[i][0])[0])
    for index in order:
        title, body = sections[index]
        _, limit, what, keep = _section_limit(title)
        room = min(limit, budget)
        if room < 256:
            body = f"[… {nbytes(body):,} bytes cut: cap {human(TEST_BYTES)} per test reached]"
        else:
            body = scrub(body, room, what, keep=keep, extra=secrets)
        budget -= nbytes(body)
        sections[index] = (title, body)
    report.sections = sections


def json_size(value: Any) -> int:
    return len(json.dumps(value, default=str, ensure_ascii=False).encode())


def bounded_info(info: dict[str, Any], secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    """The `dflash` property redacted and within PROPERTY_BYTES as JSON (it goes into JUnit's properties and
    the verdict): strings cut to ITEM_BYTES, then shorter; if still too big, the largest of notes / facts /
    metrics / diagnoses is dropped (emptied, types kept for the verdict builder) and a note says so."""
    item = ITEM_BYTES
    clean: dict[str, Any] = bound_obj(info, item=item, what="verdict entry", extra=secrets)
    while json_size(clean) > PROPERTY_BYTES and item > 512:
        item //= 2
        clean = bound_obj(info, item=item, what="verdict entry", extra=secrets)
    droppable = ("facts", "service_facts", "metrics", "notes", "diagnosis")
    dropped: list[str] = []
    while json_size(clean) > PROPERTY_BYTES:
        present = [key for key in droppable if clean.get(key) and key not in dropped]
        if not present:
            break
        key = max(present, key=lambda k: json_size(clean[k]))
        cut = json_size(clean[key])
        clean[key] = type(clean[key])()
        dropped.append(key)
        note = f"[… {cut:,} bytes of {key} cut: cap {human(PROPERTY_BYTES)} per test property]"
        clean["notes"] = [*clean.get("notes", []), note]
    return clean
