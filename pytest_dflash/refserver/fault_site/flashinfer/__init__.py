"""A FlashInfer whose sampling module is JIT-built on first use (see fault_site/__init__.py)."""
