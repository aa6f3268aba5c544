"""pytest-dflash: acceptance tests for SGLang DFlash / DDTree inference hosts."""

from __future__ import annotations

__version__ = "0.1.0"
