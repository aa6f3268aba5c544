"""Structural-tag support for function calling, imported by server_args.py before flags are parsed.

SGLang 0.5.17 does ``from xgrammar import StructuralTag`` unguarded in
``sglang/srt/function_call/inkling_detector.py``, reached from ``server_args.py``; with an xgrammar
that lacks it (0.1.10 on the seed host) the server dies at import with exit status 1. The refserver
needs no xgrammar, so the import runs only under ``--inject xgrammar-structural-tag``, against the
old xgrammar in fault_site/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_dflash.refserver import faults

if "xgrammar-structural-tag" in faults.active() and not TYPE_CHECKING:
    from xgrammar import StructuralTag

    STRUCTURAL_TAG = StructuralTag
