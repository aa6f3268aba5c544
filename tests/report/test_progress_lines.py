"""report/progress.py: a progress file's line that cannot be read is skipped, whatever it holds."""

from __future__ import annotations

import pytest

from pytest_dflash.report.progress import Line


def test_a_line_round_trips() -> None:
    line = Line("gpu7/dflash: ready in 41.0s", fleet=("gpu7", "dflash", "ready"))
    assert Line.from_json(line.to_json()) == line


@pytest.mark.parametrize("raw", [b"not json\n", b"[1, 2]\n", b'{"kind": "event"}\n', b"[" * 100_000],
                         ids=["not-json", "a-list", "no-text", "nested-too-deep"])
def test_a_line_that_cannot_be_read_is_none(raw: bytes) -> None:
    """A torn or hostile line (nested past what json follows was a RecursionError) is skipped, not a crash of
    the reader that prints every worker's lines."""
    assert Line.from_json(raw) is None
