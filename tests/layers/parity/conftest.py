"""The parity self-tests replay real recorded SGLang responses (fixtures shared through tests/support)."""

from __future__ import annotations

from support.recorded import recorded, replay

__all__ = ["recorded", "replay"]
