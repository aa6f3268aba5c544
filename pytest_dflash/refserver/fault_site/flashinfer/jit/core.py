"""JitSpec.build_and_load and the architecture check, shaped like flashinfer/jit/core.py."""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest_dflash.refserver.fault_site.flashinfer.compilation_context import CompilationContext

# Set by the refserver: how long a cold build of a module takes (real H200: 84-114 s for sampling).
BUILD_SECONDS: float = 0.0

_current_compilation_context: CompilationContext | None = None


def check_cuda_arch() -> None:
    global _current_compilation_context
    if _current_compilation_context is None:
        _current_compilation_context = CompilationContext()
    eligible = False
    for major, minor in _current_compilation_context.TARGET_CUDA_ARCHS:
        if major >= 8 or (major == 7 and minor.isdigit() and int(minor) >= 5):
            eligible = True
    if not eligible:
        raise RuntimeError("FlashInfer requires GPUs with sm75 or higher")


class JitSpec:
    def __init__(self, name: str, functions: dict[str, Callable[..., object]]) -> None:
        self.name = name
        self.functions = functions

    def build(self) -> None:
        check_cuda_arch()
        time.sleep(BUILD_SECONDS)  # ninja + nvcc, silently, inside the scheduler

    def build_and_load(self) -> JitModule:
        self.build()
        return JitModule(self.functions)


class JitModule:
    def __init__(self, functions: dict[str, Callable[..., object]]) -> None:
        self._functions = functions

    def __getattr__(self, name: str) -> Callable[..., object]:
        return self._functions[name]
