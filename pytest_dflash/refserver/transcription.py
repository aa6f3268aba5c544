"""Audio routes' import chain, imported by server.py (SGLang: http_server -> serving_transcription).

SGLang 0.5.17's HTTP server imports its OpenAI transcription/realtime routes at module level, and
those ``import soundfile as sf``: without soundfile the server dies at import, exit status 1, the
port never opens (seed 000). soundfile is a refserver dependency for the same reason, so a venv
without it fails the same way. ``--inject missing-soundfile`` takes the directories that hold it
off sys.path for this one statement, so the import system itself raises the genuine error.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from pytest_dflash.refserver import faults

_saved_path = faults.path_without("soundfile") if "missing-soundfile" in faults.active() else None
try:
    if not TYPE_CHECKING:  # soundfile ships no type information
        import soundfile as sf

        SOUNDFILE_VERSION = sf.__version__
finally:
    if _saved_path is not None:
        sys.path[:] = _saved_path
