"""An xgrammar from before ``StructuralTag`` existed: ``from xgrammar import StructuralTag`` fails."""

from __future__ import annotations

from . import structural_tag

__all__ = ["GrammarCompiler", "structural_tag"]


class GrammarCompiler:
    """Present in every xgrammar release; here only so the package is not empty."""
