"""A Triton kernel that does not compile (tl.arange over a non-power-of-2 range), run on the H200 to
record Triton's real CompilationError text for the diagnosis catalog (see docs/gpu-layers.md)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def bad_kernel(x_ptr, n):
    offsets = tl.arange(0, 1000)
    tl.store(x_ptr + offsets, offsets, mask=offsets < n)


if __name__ == "__main__":
    x = torch.zeros(1000, device="cuda", dtype=torch.int32)
    bad_kernel[(1,)](x, 1000)
    torch.cuda.synchronize()
