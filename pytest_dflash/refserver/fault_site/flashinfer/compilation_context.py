"""Target CUDA architectures, as FlashInfer 0.6.x derives them (compilation_context.py).

FlashInfer reads the CUDA version from nvcc; an SM 12.x GPU needs CUDA >= 12.9. On failure it logs a
warning and leaves the target list empty, so check_cuda_arch() later raises a misleading error.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("pytest_dflash.refserver")

# Set by the refserver before first use: what the simulated host reports.
DEVICE_CAPABILITY: tuple[int, int] = (9, 0)
NVCC_VERSION: tuple[int, int] = (13, 0)


class CompilationContext:
    def __init__(self) -> None:
        self.TARGET_CUDA_ARCHS: set[tuple[int, str]] = set()
        try:
            major, minor = get_device_capability()
            self.TARGET_CUDA_ARCHS.add((major, f"{minor}a" if major >= 9 else str(minor)))
        except Exception as e:
            logger.warning(f"Failed to get device capability: {e}.")


def get_device_capability() -> tuple[int, int]:
    major, minor = DEVICE_CAPABILITY
    if major == 12 and NVCC_VERSION < (12, 9):
        raise RuntimeError("SM 12.x requires CUDA >= 12.9")
    return major, minor
