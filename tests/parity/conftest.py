"""The parity self-tests replay real recorded SGLang responses (fixtures shared with the generation tests)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from recorded_fixtures import recorded, replay

__all__ = ["recorded", "replay"]
