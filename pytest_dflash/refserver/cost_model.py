"""The emulated GPU: what a scheduler iteration costs (--gpu-step-ms) and the memory figures SGLang logs.

On a GPU a forward pass costs about the same for 1 or 9 tokens and for 1 or many sequences
(memory-bound), which is why speculative decoding pays off; docs/refserver.md (--gpu-step-ms).
"""

from __future__ import annotations

from pytest_dflash.refserver.model import TinyLM

__all__ = ["avail_mem_gb", "gpu_step_seconds", "weights_gb"]


def gpu_step_seconds(step_ms: float, draft_ms: float | None, algorithm: str) -> float:
    """Floor of one scheduler iteration under the GPU cost model: a target pass, plus a draft pass if
    speculative."""
    if step_ms <= 0:
        return 0.0
    draft = step_ms / 8 if draft_ms is None else draft_ms
    return (step_ms + (draft if algorithm != "NONE" else 0.0)) / 1000


def avail_mem_gb() -> float:
    """MemAvailable in GiB: the "avail mem" of SGLang's load lines (0 where /proc/meminfo is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def weights_gb(model: TinyLM) -> float:
    """The model's weights in GiB: "mem usage" at load and memory_usage.weight in /server_info."""
    tensors = [model.embed, model.unembed, model.bigram,
               *(w for layer in model.layers for w in layer.values())]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**30
