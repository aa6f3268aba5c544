"""The emulated GPU: what a scheduler iteration costs (--gpu-step-ms, --gpu-token-us) and the memory figures
SGLang logs.

On a GPU a forward pass costs about the same for 1 or 9 tokens and for 1 or many sequences while it is
memory-bound, which is why speculative decoding pays off; as the batch grows, the tokens the pass verifies
(batch × tokens per sequence) fill the GPU's compute and each of them starts to cost: --gpu-token-us charges
that, so speculation's advantage falls with concurrency and a crossover exists (docs/refserver.md).
"""

from __future__ import annotations

from pytest_dflash.refserver.model import TinyLM

__all__ = ["avail_mem_gb", "gpu_step_seconds", "gpu_token_seconds", "verified_tokens", "weights_gb"]


def gpu_step_seconds(step_ms: float, draft_ms: float | None, algorithm: str) -> float:
    """Floor of one scheduler iteration under the GPU cost model: a target pass, plus a draft pass if
    speculative."""
    if step_ms <= 0:
        return 0.0
    draft = step_ms / 8 if draft_ms is None else draft_ms
    return (step_ms + (draft if algorithm != "NONE" else 0.0)) / 1000


def verified_tokens(algorithm: str, block_size: int, ddtree_budget: int) -> int:
    """Tokens the target's pass verifies per sequence: 1 without speculation; the block
    (--speculative-num-draft-tokens: the last committed token plus the drafts) for a chain or a top-k tree;
    DDTREE verifies its whole tree of `ddtree_budget` nodes plus the root in one pass (spec.py build_tree)."""
    if algorithm == "NONE":
        return 1
    if algorithm == "DDTREE":
        return ddtree_budget + 1
    return block_size


def gpu_token_seconds(token_us: float, algorithm: str, block_size: int, ddtree_budget: int) -> float:
    """What one running sequence adds to an iteration's floor (--gpu-token-us × the tokens it verifies): an
    iteration over a batch of B sequences costs gpu_step_seconds + B × this."""
    if token_us <= 0:
        return 0.0
    return token_us * verified_tokens(algorithm, block_size, ddtree_budget) / 1e6


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
