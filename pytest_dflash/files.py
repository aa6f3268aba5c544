"""Writing files so that a reader never sees half of one: a report (a merge, node_exporter), a provisioning
marker (a later run's reaper)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, text: str, *, sync: bool = True) -> None:
    """Replace `path` atomically: a temp file in the same folder (not matching *.prom / *.json), optional
    fsync, chmod 0644, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
