"""Where a run will write, checked before it starts. A report path that cannot be written is a one-line usage
error at once, not an INTERNALERROR from pytest-html or a junitxml traceback after a 20-minute run, and not a
host's failed check (a probe dump written during the env layer) blamed on the host."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from pytest_dflash.config import options

# (ini key, "dir" | "file"): the plugin's own outputs; the report dir itself is checked where its verdicts are
# first written (report/session.py `start`)
_OWN_OUTPUTS = (
    ("dflash_probe_dump", "dir"),
    ("dflash_history", "dir"),
    ("dflash_prometheus", "file"),
    ("dflash_save_env_snapshot", "file"),
)


def unwritable_output(config: pytest.Config) -> pytest.UsageError | None:
    """The first output path of this run that cannot be written, as the usage error to raise; None when all
    can. Folders that do not exist yet are created (the run would create them anyway)."""
    wanted: list[tuple[str, Path, str]] = []
    for dest, kind in _OWN_OUTPUTS:
        found = options.path(config, dest)
        if found is not None:
            wanted.append((options.where(dest), found, kind))
    if options.flag(config, "dflash_update_baseline"):
        found = options.path(config, "dflash_baseline_dir")
        if found is not None:
            wanted.append((options.where("dflash_baseline_dir"), found, "dir"))
    for attribute, flag in (("htmlpath", "--html"), ("xmlpath", "--junitxml")):
        raw = getattr(config.option, attribute, None)
        if raw:
            found = Path(str(raw)).expanduser()
            found = found if found.is_absolute() else config.invocation_params.dir / found
            wanted.append((flag, found, "file"))
    for where, found, kind in wanted:
        problem = cannot_write(found, kind)
        if problem is not None:
            return pytest.UsageError(f"{where} {found}: cannot write there: {problem}")
    return None


def cannot_write(path: Path, kind: str) -> str | None:
    """Why `path` (a folder, or a file to be created or replaced) cannot be written, or None: the folder is
    created and a scratch file written to it and removed, which is what the writer will do."""
    folder = path if kind == "dir" else path.parent
    if kind == "file" and path.is_dir():
        return "it is a folder"
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dflash-write-check-"):
            pass
    except OSError as exc:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else (exc.strerror or str(exc))
    if kind == "file" and path.exists() and not os.access(path, os.W_OK):
        return "the file is read-only"
    return None


__all__ = ["cannot_write", "unwritable_output"]
