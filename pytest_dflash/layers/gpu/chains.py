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
# The grammar backend a command asks for (--grammar-backend, default xgrammar): SGLang creates it at start-up
# (create_grammar_backend) and imports the backend's package then, which must be the version SGLang requires
# (GRAMMAR_BACKENDS: the chain's check reads it from the packages probe). `none` imports nothing: nothing to
# check, and the generation layer names it (layers/generation/structured.py).
GRAMMAR_BACKEND_DEFAULT = "xgrammar"


@dataclass(frozen=True)
class Pin:
    """A module a grammar backend imports, its distribution, and the version range required of it."""

    module: str
    distribution: str  # PEP 503 normalised
    requirement: str  # as SGLang 0.5.17's wheel pins it (METADATA Requires-Dist), or `through`'s
    through: str = "sglang"  # the distribution whose Requires-Dist line it is (outlines pins outlines-core)


@dataclass(frozen=True)
class GrammarBackend:
    name: str
    chain: str  # the import chain that imports it
    pins: tuple[Pin, ...]


# What SGLang 0.5.17 requires of each backend (its wheel's Requires-Dist: xgrammar==0.2.1, outlines==0.1.11,
# llguidance<2.0.0,>=1.7.6; outlines 0.1.11's own: outlines_core==0.1.26). The installed sglang's (or
# outlines') Requires-Dist line wins where the packages probe read one: another release pins other versions.
GRAMMAR_BACKENDS: dict[str, GrammarBackend] = {
    "xgrammar": GrammarBackend("xgrammar", "grammar", (Pin("xgrammar", "xgrammar", "xgrammar==0.2.1"),)),
    "outlines": GrammarBackend("outlines", "grammar_outlines", (
        Pin("outlines", "outlines", "outlines==0.1.11"),
        Pin("outlines_core", "outlines-core", "outlines-core==0.1.26", through="outlines"))),
    "llguidance": GrammarBackend("llguidance", "grammar_llguidance",
                                 (Pin("llguidance", "llguidance", "llguidance<2.0.0,>=1.7.6"),)),
}  # fmt: skip
# the distributions whose Requires-Dist the pins read (the packages probe's requirers)
PIN_REQUIRERS: tuple[str, ...] = tuple(dict.fromkeys(pin.through for backend in GRAMMAR_BACKENDS.values()
                                                     for pin in backend.pins))
GRAMMAR_CHAINS: dict[str, dict[str, Chain]] = {
    # xgrammar, the default, is imported by the "grammar" chain (sglang.srt.constrained.xgrammar_backend)
    "sglang": {
        backend: Chain(f"grammar_{backend}", (backend, f"sglang.srt.constrained.{backend}_backend"),
                       f"--grammar-backend {backend}: SGLang imports it when the server starts; without it "
                       "constrained requests (json_schema, regex, EBNF, tool-call forcing) cannot be served")
        for backend in ("outlines", "llguidance")
    },
    "pytest_dflash.refserver": {
        backend: Chain("refserver_grammar", ("xgrammar", "pytest_dflash.refserver.structured"),
                       "the reference server's constrained decoding (xgrammar, any --grammar-backend)")
        for backend in ("xgrammar", "outlines", "llguidance")
    },
}
ALL_CHAINS: tuple[str, ...] = tuple(dict.fromkeys(
    [c.name for chains in ENTRYPOINTS.values() for c in chains]
    + [c.name for by_backend in GRAMMAR_CHAINS.values() for c in by_backend.values()]))


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


def grammar_backend(argv: Sequence[str]) -> str:
    """The --grammar-backend a command asks for (`--grammar-backend X` or `=X`), else SGLang's default."""
    backend = GRAMMAR_BACKEND_DEFAULT
    for index, token in enumerate(argv):
        if token == "--grammar-backend" and index + 1 < len(argv):
            backend = argv[index + 1]
        elif token.startswith("--grammar-backend="):
            backend = token.split("=", 1)[1]
    return backend


def grammar_flag(argv: Sequence[str]) -> str:
    """How the command chose its grammar backend, for a message: `--grammar-backend X`, or the default."""
    backend = grammar_backend(argv)
    asked = any(t == "--grammar-backend" or t.startswith("--grammar-backend=") for t in argv)
    return f"--grammar-backend {backend}" if asked else f"no --grammar-backend (SGLang's default: {backend})"


def grammar_backends(commands: Iterable[Sequence[str]], chain: str) -> list[tuple[str, GrammarBackend]]:
    """(flag, backend) of every SGLang command whose grammar backend `chain` imports, each flag once."""
    found: dict[str, GrammarBackend] = {}
    for argv in commands:
        if ENTRYPOINTS.get(entrypoint(argv) or "") is not SGLANG_CHAINS:
            continue
        backend = GRAMMAR_BACKENDS.get(grammar_backend(argv))
        if backend is not None and backend.chain == chain:
            found.setdefault(grammar_flag(argv), backend)
    return list(found.items())


def chains_for(commands: Iterable[Sequence[str]]) -> list[Chain]:
    """The chains of every service command, each once, in a stable order: its entry point's, then its
    grammar backend's."""
    seen: dict[str, Chain] = {}
    for argv in commands:
        point = entrypoint(argv) or ""
        for chain in ENTRYPOINTS.get(point, ()):
            seen.setdefault(chain.name, chain)
        family = "sglang" if ENTRYPOINTS.get(point) is SGLANG_CHAINS else point
        grammar = GRAMMAR_CHAINS.get(family, {}).get(grammar_backend(argv))
        if grammar is not None:
            seen.setdefault(grammar.name, grammar)
    return list(seen.values())

