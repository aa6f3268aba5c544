"""Synthetic third-party packages for fault injection (see faults.py); never imported otherwise.

``xgrammar/`` is an xgrammar that predates ``StructuralTag`` (0.1.10, as on the seed host); this
directory goes on sys.path only under ``--inject xgrammar-structural-tag``. ``flashinfer/`` models
FlashInfer's sampling JIT path: its code really raises (``flashinfer-sm120``) or really blocks while
"compiling" (``cold-jit``), so the scheduler's traceback has FlashInfer's frames.
"""
