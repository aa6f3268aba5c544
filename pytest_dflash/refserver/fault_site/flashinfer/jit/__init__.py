"""FlashInfer's JIT: a module spec is built (ninja + nvcc) on first use and cached."""
