"""The seven layers, cheapest and most decisive first (like `dcgmi diag -r 1..4`), which are host-wide, and
their one-line help. Who blocks whom when one fails is run/blocking.py.
"""

from __future__ import annotations

LAYERS = ("host", "env", "kernels", "service", "generation", "parity", "perf")
HOST_WIDE = frozenset({"host", "env", "kernels"})
LAYER_HELP = {
    "host": "host reachable; GPUs visible; arch, driver, memory, kernel log (Xid/OOM)",
    "env": "the server's venv imports its serving chain; torch/sglang-kernel/flashinfer/xgrammar consistent",
    "kernels": "FlashInfer sampling + attention and a Triton kernel build on a cold JIT cache and run "
               "correctly",
    "service": "the unit/process starts, stays up, and is ready by a real greedy + sampled generation",
    "generation": "the full sampling path: greedy, sampled, stream, stop, n, long prompts, concurrency, "
                  "errors",
    "parity": "speculative decoding is lossless: DDTREE == DFLASH == target at temperature 0; same "
              "distribution",
    "perf": "throughput, TTFT/ITL and accept length above the host's floors and its baseline",
}


def rank(layer: str) -> int:
    return LAYERS.index(layer) if layer in LAYERS else len(LAYERS)
