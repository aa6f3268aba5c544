"""pytest plugin entry point (work in progress: options and fixtures land here)."""

from __future__ import annotations
