"""Layers, cheapest and most decisive first (like `dcgmi diag -r 1..4`), and who blocks whom.

A failure in a lower layer turns that host's higher-layer tests into skips that name the root
failure, instead of dozens of red tests that all say "connection refused". Host-wide layers
(host, env, kernels) block everything on the host; service layers block the higher layers of
the same service only (a dead DFLASH service does not hide a DDTREE result).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_dflash.evidence.bounds import LINE_BYTES, scrub

LAYERS = ("host", "env", "kernels", "service", "generation", "parity", "perf")
HOST_WIDE = frozenset({"host", "env", "kernels"})
LAYER_HELP = {
    "host": "host reachable; GPUs visible; arch, driver, memory, kernel log (Xid/OOM)",
    "env": "the server's venv imports its serving chain; torch/sglang-kernel/flashinfer/xgrammar consistent",
    "kernels": "FlashInfer sampling + attention and a Triton kernel build on a cold JIT cache and run correctly",
    "service": "the unit/process starts, stays up, and is ready by a real greedy + sampled generation",
    "generation": "the full sampling path: greedy, sampled, stream, stop, n, long prompts, concurrency, errors",
    "parity": "speculative decoding is lossless: DDTREE == DFLASH == target at temperature 0; same distribution",
    "perf": "throughput, TTFT/ITL and accept length above the host's floors and its baseline",
}
BLOCKED_PREFIX = "blocked: "


def rank(layer: str) -> int:
    return LAYERS.index(layer) if layer in LAYERS else len(LAYERS)


@dataclass(frozen=True)
class Failure:
    """A recorded failure of one layer on one host (optionally one service)."""

    host: str
    layer: str
    service: str | None
    test: str
    summary: str

    def blocks(self, layer: str, services: Iterable[str]) -> bool:
        if rank(self.layer) >= rank(layer):
            # same layer: only a service that died blocks the rest of its own layer
            return False
        if self.layer in HOST_WIDE or self.service is None:
            return True
        return self.service in set(services)


@dataclass
class LayerBook:
    """Failures seen so far in this process, to decide which later tests are blocked."""

    failures: list[Failure] = field(default_factory=list)
    dead: dict[tuple[str, str], Failure] = field(default_factory=dict)

    def record(self, failure: Failure) -> None:
        self.failures.append(failure)

    def record_death(self, failure: Failure) -> None:
        """A service died: every later test that needs it is blocked, whatever its layer."""
        self.dead.setdefault((failure.host, failure.service or ""), failure)

    def blocker(self, host: str, layer: str, services: Iterable[str]) -> Failure | None:
        services = list(services)
        for service in services:
            death = self.dead.get((host, service))
            if death is not None:
                return death
        for failure in self.failures:
            if failure.host == host and failure.blocks(layer, services):
                return failure
        return None


def blocked_reason(failure: Failure) -> str:
    where = f"{failure.host}/{failure.service}" if failure.service else failure.host
    return blocked_message(f"{failure.layer} layer failed on {where} ({failure.test}): {failure.summary}")


def blocked_message(text: str) -> str:
    """The skip message of a test blocked by `text` (a failure summary): redacted and one line's size, as it
    goes to the terminal, JUnit, HTML and the verdict."""
    return scrub(f"{BLOCKED_PREFIX}{text}", LINE_BYTES, "skip reason", keep="head")


def is_blocked(skip_message: str) -> bool:
    """Was this skip a block (a lower layer or the service failed), not a plain skip?"""
    return skip_message.startswith(BLOCKED_PREFIX)
