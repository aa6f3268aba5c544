"""GPU host layers (host, env, kernels): probe results parsed and checked on the controller side.

The probes themselves are standalone scripts in pytest_dflash/hostaccess/probes/ that run on the host under
test; everything here is pure and typed, and is unit-tested with outputs recorded on real hosts.
"""

from __future__ import annotations

from pytest_dflash.layers.gpu.layer import GpuHost, GpuOptions

__all__ = ["GpuHost", "GpuOptions"]
