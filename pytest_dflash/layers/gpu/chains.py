"""The serving import chains a service depends on, derived from the command it runs.

A service whose command (or unit ExecStart, read by services/systemd.py) runs `-m sglang.launch_server` /
`sglang serve` needs SGLang's chain; one running `-m pytest_dflash.refserver` needs the reference server's.
Each chain is imported in its own fresh interpreter by the import_chain probe, so one broken package cannot
hide another.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Chain:
    name: str
    modules: tuple[str, ...]
    why: str  # what breaks when it does not import


SGLANG_CHAINS = (
    Chain("http_server", ("sglang.srt.entrypoints.http_server",),
          "sglang's HTTP server; imports the OpenAI transcription/realtime routes and with them soundfile"),
    Chain("grammar", ("sglang.srt.server_args", "sglang.srt.function_call.function_call_parser",
                      "sglang.srt.constrained.xgrammar_backend"),
          "server arguments and the function-call/grammar modules; import xgrammar's StructuralTag before "
          "arguments are parsed (so --grammar-backend none cannot avoid it)"),
    Chain("sgl_kernel", ("sgl_kernel",),
          "sglang-kernel's compiled ops; 'undefined symbol' means it was built for another torch"),
    Chain("flashinfer", ("flashinfer", "flashinfer.sampling"),
          "FlashInfer's Python package (sampling and attention kernels, JIT-compiled on first use)"),
)
REFSERVER_CHAINS = (
    Chain("refserver_args", ("pytest_dflash.refserver.server_args",),
          "the reference server's argument parsing (SGLang's order: before flags are parsed)"),
    Chain("refserver_http", ("pytest_dflash.refserver.server",),
          "the reference server's HTTP server; imports its transcription routes and with them soundfile"),
)
ENTRYPOINTS: dict[str, tuple[Chain, ...]] = {
    "sglang.launch_server": SGLANG_CHAINS,
    "sglang.cli": SGLANG_CHAINS,
    "pytest_dflash.refserver": REFSERVER_CHAINS,
}
ALL_CHAINS: tuple[str, ...] = tuple(dict.fromkeys(c.name for chains in ENTRYPOINTS.values() for c in chains))


def entrypoint(argv: Sequence[str]) -> str | None:
    """The Python entry point a command runs: '-m X' -> 'X'; 'sglang serve ...' -> 'sglang.cli'."""
    for index, token in enumerate(argv):
        if token == "-m" and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith("-m") and len(token) > 2 and not token.startswith("--"):
            return token[2:]
    if argv and argv[0].rsplit("/", 1)[-1] == "sglang" and "serve" in argv[1:2]:
        return "sglang.cli"
    return None


def chains_for(commands: Iterable[Sequence[str]]) -> list[Chain]:
    """The chains of every service command, each once, in a stable order."""
    seen: dict[str, Chain] = {}
    for argv in commands:
        point = entrypoint(argv)
        for chain in ENTRYPOINTS.get(point or "", ()):
            seen.setdefault(chain.name, chain)
    return list(seen.values())

