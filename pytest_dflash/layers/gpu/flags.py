"""SGLang command-line flags that releases removed, with what replaced them, and the check of a
service's command.

Read from the sglang wheels 0.5.17 to 0.5.23 on PyPI (tests/data/sglang-versions/releases.toml, written by
read_wheels.py there; a self-test keeps this table equal to it). A removed flag makes SGLang's argparse exit 2
with "error: unrecognized arguments" before anything loads; the env layer names it, and its replacement,
before the server is started. Flags SGLang never had (an overlay's, such as ddtree-v2's) are not judged here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from pytest_dflash.layers.gpu.chains import entrypoint

SGLANG_ENTRYPOINTS = frozenset({"sglang.launch_server", "sglang.cli"})
NEWEST_READ = "0.5.23"  # the newest release whose flags were read


@dataclass(frozen=True)
class RemovedFlag:
    flag: str
    removed_in: str  # the first release without it
    replacement: str | None  # what SGLang's own deprecation warning (or help text) names; None: nothing
    deprecated: bool  # the last release that had it warned it was deprecated
    source: str  # where the last release defined it (release, file:line in the wheel)

    @property
    def last_in(self) -> str:
        return self.source.split(" ", 1)[0]


def _r(flag: str, removed_in: str, replacement: str | None, source: str, *,
       deprecated: bool = True) -> RemovedFlag:
    return RemovedFlag(flag, removed_in, replacement, deprecated, source)


_SA19 = "0.5.19 sglang/srt/server_args.py:"
_F = "sglang/srt/arg_groups/fields/"
# Replacements SGLang named only in the removed field's help text ("[Deprecated] Alias for ...",
# "Deprecated. Use ...").
HELP_TEXT_REPLACEMENTS = {"--elastic-ep-rejoin": "0.5.20 " + _F + "exec_.py:782",
                          "--keep-mm-feature-on-device": "0.5.20 " + _F + "mm.py:162"}
REMOVED_FLAGS: tuple[RemovedFlag, ...] = (
    _r("--torchao-config", "0.5.18", None, "0.5.17 sglang/srt/server_args.py:2015", deprecated=False),
    _r("--collect-tokens-histogram", "0.5.20", None, _SA19 + "3866"),
    _r("--cuda-graph-bs", "0.5.20", "--cuda-graph-bs-decode", _SA19 + "3936"),
    _r("--cuda-graph-max-bs", "0.5.20", "--cuda-graph-max-bs-decode", _SA19 + "3928"),
    _r("--disable-piecewise-cuda-graph", "0.5.20", "--cuda-graph-backend-prefill=disabled", _SA19 + "3959"),
    _r("--dsa-prefill-cp-mode", "0.5.20", "--cp-strategy", _SA19 + "4031"),
    _r("--enable-breakable-cuda-graph", "0.5.20", "--cuda-graph-backend-prefill=breakable", _SA19 + "3951"),
    _r("--enable-dsa-prefill-context-parallel", "0.5.20", "--enable-prefill-cp", _SA19 + "4003"),
    _r("--enable-expert-distribution-metrics", "0.5.20", None, _SA19 + "3841"),
    _r("--enable-gdn-replayssm-spec", "0.5.20", "--enable-linear-replayssm-spec", _SA19 + "4017"),
    _r("--enable-nsa-prefill-context-parallel", "0.5.20", "--enable-prefill-cp", _SA19 + "4010"),
    _r("--enable-prefill-context-parallel", "0.5.20", "--enable-prefill-cp", _SA19 + "4024"),
    _r("--enforce-piecewise-cuda-graph", "0.5.20", "--cuda-graph-backend-prefill=tc_piecewise",
       _SA19 + "3967"),
    _r("--mamba-scheduler-strategy", "0.5.20", "--mamba-radix-cache-strategy", _SA19 + "3919"),
    _r("--nsa-decode-backend", "0.5.20", "--dsa-decode-backend", _SA19 + "3891"),
    _r("--nsa-prefill-backend", "0.5.20", "--dsa-prefill-backend", _SA19 + "3871"),
    _r("--nsa-prefill-cp-mode", "0.5.20", "--cp-strategy", _SA19 + "4045"),
    _r("--piecewise-cuda-graph-compiler", "0.5.20", "--cuda-graph-tc-compiler", _SA19 + "3986"),
    _r("--piecewise-cuda-graph-max-tokens", "0.5.20", "--cuda-graph-max-bs-prefill", _SA19 + "3995"),
    _r("--piecewise-cuda-graph-tokens", "0.5.20", "--cuda-graph-bs-prefill", _SA19 + "3977"),
    _r("--prefill-cp-mode", "0.5.20", "--cp-strategy", _SA19 + "4055"),
    _r("--prefill-round-robin-balance", "0.5.20", None, _SA19 + "3861"),
    _r("--speculative-dflash-draft-window-size", "0.5.20", "--speculative-draft-window-size", _SA19 + "3911"),
    _r("--stream-output", "0.5.20", "--incremental-streaming-output", _SA19 + "3854"),
    _r("--elastic-ep-rejoin", "0.5.21", "--elastic-ep-join-mode recover", "0.5.20 " + _F + "exec_.py:780",
       deprecated=False),
    _r("--keep-mm-feature-on-device", "0.5.21", "--mm-feature-transport=cuda_ipc",
       "0.5.20 " + _F + "mm.py:160", deprecated=False),
    _r("--cuda-graph-tc-compiler", "0.5.22", None, "0.5.21 " + _F + "exec_.py:533", deprecated=False),
    _r("--speculative-skip-dp-mlp-sync", "0.5.23", None, "0.5.22 " + _F + "spec.py:229", deprecated=False),
)
_BY_FLAG = {r.flag: r for r in REMOVED_FLAGS}


def parse_version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def newer_than_read(installed: str) -> bool:
    """Whether `installed` is a release after the newest one read (its own removals are unknown)."""
    version = parse_version(installed)
    return version is not None and Version(version.base_version) > Version(NEWEST_READ)


def runs_sglang(argv: Sequence[str]) -> bool:
    """Whether a command starts SGLang's server (`-m sglang.launch_server`, `sglang serve`)."""
    return entrypoint(argv) in SGLANG_ENTRYPOINTS


def command_flags(argv: Sequence[str]) -> list[str]:
    """The long options of a command, in order, once each ('--x=1' -> '--x')."""
    return list(dict.fromkeys(token.split("=", 1)[0] for token in argv
                              if token.startswith("--") and len(token) > 2))


@dataclass(frozen=True)
class FlagFinding:
    """A flag of `service`'s command that the installed sglang (`installed`) no longer has, or soon
    will not."""

    service: str
    installed: str
    removed: RemovedFlag
    gone: bool  # True: the installed release rejects it; False: it still takes it, a later release does not

    def replacement(self) -> str:
        """What to use instead; where the installed release removed the replacement too, says so."""
        instead = self.removed.replacement
        if instead is None:
            return "SGLang names no replacement: drop it"
        later = _BY_FLAG.get(instead.split("=", 1)[0].split(" ", 1)[0])
        installed = parse_version(self.installed)
        if later is not None and installed is not None and installed >= Version(later.removed_in):
            then = f"use {later.replacement}" if later.replacement else "drop it"
            return f"its replacement {instead} was removed too (in sglang {later.removed_in}): {then}"
        return f"use {instead}"

    def describe(self) -> str:
        r = self.removed
        if self.gone:
            return (f"service {self.service}: {r.flag} was removed in sglang {r.removed_in} (installed: "
                    f"{self.installed}; last in {r.last_in}: {r.source.split(' ', 1)[1]}); "
                    f"{self.replacement()}")
        return (f"service {self.service}: {r.flag} goes away in sglang {r.removed_in} (installed: "
                f"{self.installed}, which still takes it); {self.replacement()}")


def flag_findings(service: str, argv: Sequence[str], installed: str) -> list[FlagFinding]:
    """The flags of one SGLang command that the installed release removed (`gone`) or a later release removes.

    A version that does not parse is not judged (empty list). Removals stay removed in releases newer than
    those read.
    """
    version = parse_version(installed)
    if version is None or not runs_sglang(argv):
        return []
    found = []
    for flag in command_flags(argv):
        removed = _BY_FLAG.get(flag)
        if removed is None:
            continue
        found.append(FlagFinding(service, installed, removed, gone=version >= Version(removed.removed_in)))
    return found
