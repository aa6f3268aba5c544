"""Where this machine keeps a run's files: markers, locks, logs, progress lines and derived unit files."""

from __future__ import annotations

import os
from pathlib import Path


def state_root() -> Path:
    """Per-user directory for markers, locks and logs of this machine's runs."""
    base = os.environ.get("DFLASH_STATE_DIR") or os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"pytest-dflash-{os.getuid()}"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path
