"""``--mimic-version X``: the refserver speaks what a later SGLang release changed (docs/sglang-versions.md).

The refserver copies SGLang 0.5.17. Each difference of a later release the plugin can observe is a pure
function here, so routes.py, state.py and __main__.py need one call each (the hooks are listed in
docs/refserver.md):

  * flags: a flag the release removed is refused as SGLang's argparse refuses it (exit 2, "error: unrecognized
    arguments: ..."); a deprecated alias it still takes logs SGLang's own warning line;
  * ``meta_info``: 0.5.21 dropped ``spec_accepted_drafts``, ``spec_proposed_drafts`` and
    ``spec_accept_histogram``;
  * ``/server_info``: ``version``; ``launch_command`` (0.5.20+: the arguments joined by spaces, without the
    program, as ``server_args._launch_command = " ".join(argv)`` of ``sys.argv[1:]``); ``"frontend":
    "python"`` (0.5.21+);
  * ``/model_info``: ``served_model_name`` (0.5.18+);
  * routes: ``GET /ready`` (0.5.20+); ``GET /get_load`` gone (0.5.21+); ``GET /ping`` 200 only while
    healthy (0.5.23+; 200 always before);
  * ``SGLANG_DIAG_BYPASS_HEALTH_GENERATE`` (0.5.19+): ``/health`` and ``/health_generate`` answer 200
    without a generation once the server is up.

Read from the sglang wheels 0.5.17 to 0.5.23 (tests/data/sglang-versions/releases.toml). Standard library
only: the refserver imports nothing of the plugin.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = ["KNOWN", "MIRRORED", "Mimic", "split_argv"]

MIRRORED = "0.5.17"
KNOWN = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
OPTION = "--mimic-version"
# Flags the refserver's parser takes that a release removed: flag -> (removed in, SGLang's replacement).
# The same rows as pytest_dflash/layers/gpu/flags.py (tests/refserver/test_mimic.py keeps them equal).
REMOVED = {
    "--speculative-dflash-draft-window-size": ("0.5.20", "--speculative-draft-window-size"),
    "--cuda-graph-max-bs": ("0.5.20", "--cuda-graph-max-bs-decode"),
}
META_ALIASES = ("spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram")
BYPASS_ENV = "SGLANG_DIAG_BYPASS_HEALTH_GENERATE"  # 0.5.19 sglang/srt/environ.py:331, EnvBool(False)
_ENV_TRUE = ("true", "1", "yes", "y")  # EnvBool.parse (environ.py:143): value.lower(); anything else is false


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Mimic:
    """One SGLang release as the refserver shows it; the default is the release it copies."""

    version: str = MIRRORED

    def __post_init__(self) -> None:
        if self.version not in KNOWN:
            raise ValueError(f"{OPTION}: {self.version!r} is not a release the refserver knows "
                             f"({', '.join(KNOWN)})")

    def at_least(self, version: str) -> bool:
        return _key(self.version) >= _key(version)

    # ---- flags ---------------------------------------------------------------------------------------------

    def unrecognized(self, argv: Sequence[str]) -> list[str]:
        """The tokens argparse of this release leaves over: each removed flag and the value that follows
        it."""
        left: list[str] = []
        tokens = list(argv)
        for index, token in enumerate(tokens):
            flag = token.split("=", 1)[0]
            if flag in REMOVED and self.at_least(REMOVED[flag][0]):
                left.append(token)
                if "=" not in token and index + 1 < len(tokens) and not tokens[index + 1].startswith("--"):
                    left.append(tokens[index + 1])
        return left

    def deprecation_lines(self, argv: Sequence[str]) -> list[str]:
        """SGLang's warning for each removed-later flag this release still takes (argparse_actions.py)."""
        return [f"'{flag}' is deprecated and will be removed in a future release. Use '{new}' instead."
                for flag, (removed_in, new) in REMOVED.items()
                if any(t.split("=", 1)[0] == flag for t in argv) and not self.at_least(removed_in)]

    # ---- what the server answers ---------------------------------------------------------------------------

    def meta_info(self, meta: dict[str, Any]) -> dict[str, Any]:
        """A generation's meta_info as this release sends it (in place, and returned)."""
        if self.at_least("0.5.21"):
            for alias in META_ALIASES:
                meta.pop(alias, None)
        return meta

    def server_info(self, info: dict[str, Any], argv: Sequence[str]) -> dict[str, Any]:
        info["version"] = self.version
        if self.at_least("0.5.20"):
            info["launch_command"] = " ".join(argv)  # sys.argv[1:]: no program (0.5.20 server_args.py:736)
        if self.at_least("0.5.21"):
            info["frontend"] = "python"
        return info

    def model_info(self, info: dict[str, Any], served_model_name: str) -> dict[str, Any]:
        if self.at_least("0.5.18"):
            info["served_model_name"] = served_model_name
        return info

    def health_bypassed(self, environ: Mapping[str, str]) -> bool:
        """0.5.19+ with SGLANG_DIAG_BYPASS_HEALTH_GENERATE true: /health and /health_generate answer 200
        without a generation once the server is up (0.5.19 http_server.py:680)."""
        return self.at_least("0.5.19") and environ.get(BYPASS_ENV, "").lower() in _ENV_TRUE

    def ping_tells_health(self) -> bool:
        """0.5.23+: GET /ping is 200 only while healthy (not shutting down, not marked unhealthy), paused or
        not; before, 200 always (0.5.23 http_server.py:2190)."""
        return self.at_least("0.5.23")

    def has_route(self, path: str) -> bool:
        """Whether this release serves `path` (only the routes that changed are judged)."""
        if path == "/ready":
            return self.at_least("0.5.20")
        if path == "/get_load":
            return not self.at_least("0.5.21")
        return True


def _exit_like_argparse(prog: str, left: Sequence[str]) -> NoReturn:
    sys.stderr.write(f"usage: {prog} [-h] ...\n{prog}: error: unrecognized arguments: {' '.join(left)}\n")
    raise SystemExit(2)


def split_argv(argv: Sequence[str], *, prog: str = "launch_server.py") -> tuple[Mimic, list[str]]:
    """Take ``--mimic-version X`` out of `argv`; a flag the release removed exits 2 as SGLang's parser
    does."""
    rest: list[str] = []
    version = MIRRORED
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token == OPTION and index + 1 < len(tokens):
            version, index = tokens[index + 1], index + 2
            continue
        if token.startswith(OPTION + "="):
            version = token.split("=", 1)[1]
        else:
            rest.append(token)
        index += 1
    try:
        mimic = Mimic(version)
    except ValueError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        raise SystemExit(2) from None
    left = mimic.unrecognized(rest)
    if left:
        _exit_like_argparse(prog, left)
    return mimic, rest
