"""files.atomic_write: a reader never sees half a file (reports, a merge, node_exporter, and the provisioning
markers a later run's reaper reads: CI once read an empty marker while a run was writing it). The same loop
with Path.write_text, the markers' old writer, read 1209 partial documents here."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from pytest_dflash.files import atomic_write


def test_a_reader_polling_while_it_is_rewritten_only_ever_reads_a_whole_document(tmp_path: Path) -> None:
    path = tmp_path / "h.dflash.123.json"
    atomic_write(path, json.dumps({"n": -1}))
    done = threading.Event()
    partial: list[str] = []

    def read() -> None:
        while not done.is_set():
            text = path.read_text()
            try:
                json.loads(text)
            except ValueError:
                partial.append(text[:40])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(200):
            atomic_write(path, json.dumps({"n": n, "pad": "x" * 200_000}), sync=False)
    finally:
        done.set()
        reader.join()
    assert partial == []
    assert json.loads(path.read_text())["n"] == 199
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "verdict.json"
    atomic_write(path, "old")
    with pytest.raises(UnicodeEncodeError):
        atomic_write(path, "\udc80")  # a lone surrogate: utf-8 cannot write it
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["verdict.json"]
