"""The module exists, the class is not exported: the shape of the old release."""

from __future__ import annotations
