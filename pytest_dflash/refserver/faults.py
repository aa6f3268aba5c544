"""Fault injection: ``--inject NAME[=VALUE][,NAME[=VALUE]...]``, each fault reproducing a seed failure.

Each fault is visible from outside the process only the way real SGLang shows it: exit status, a
dropped connection, log text, 503s. The traceback texts come from real code paths: an import that
really fails, a synthetic ``xgrammar`` / ``flashinfer`` (``fault_site/``) whose code really raises.
See docs/refserver.md for the table of faults and the incidents they reproduce.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FAULTS", "Faults", "activate_from_argv", "active", "kill_self", "parse_inject", "path_without"]

logger = logging.getLogger("pytest_dflash.refserver")

FAULT_SITE = Path(__file__).with_name("fault_site")


@dataclass(frozen=True)
class FaultSpec:
    """What VALUE means for one fault; ``default`` None means a value is required."""

    value: str  # '' for faults that take no value
    default: float | None
    integer: bool = False
    rank: bool = False  # VALUE is a TP rank (0 allowed), optionally `@K`: after K user requests (NAME@ = K)


FAULTS: dict[str, FaultSpec] = {
    "missing-soundfile": FaultSpec("delay_s", 0.0),
    "xgrammar-structural-tag": FaultSpec("delay_s", 0.0),
    "flashinfer-sm120": FaultSpec("seconds_until_death", 3.0),
    "slow-load": FaultSpec("seconds", None),
    "slow-graphs": FaultSpec("seconds", None),
    "oom-kill": FaultSpec("n_requests", None, integer=True),
    "crash-after": FaultSpec("seconds", None),
    "hang": FaultSpec("n", 1, integer=True),
    "truncated-stream": FaultSpec("", 0.0),
    "bad-json": FaultSpec("", 0.0),
    "tree-verify-bug": FaultSpec("", 0.0),
    "grammar-rollback-bug": FaultSpec("", 0.0),
    "reasoning-grammar-bug": FaultSpec("", 0.0),
    "ignore-tools": FaultSpec("", 0.0),
    "tools-greedy-only": FaultSpec("", 0.0),
    "greedy-fallback": FaultSpec("", 0.0),
    "slow-decode": FaultSpec("factor", None),
    "token-delay": FaultSpec("seconds_per_token", None),
    "wedge": FaultSpec("n_requests", None, integer=True),
    "cold-jit": FaultSpec("seconds", None),
    "scheduler-crash": FaultSpec("delay_s", 0.0),
    "scheduler-segv": FaultSpec("seconds", None),
    # tensor-parallel ranks (--tp-size N > 1, refserver/ranks.py)
    "rank-crash": FaultSpec("rank[@n_requests]", None, integer=True, rank=True),
    "rank-hang": FaultSpec("rank[@n_requests]", None, integer=True, rank=True),
    "rank-oom": FaultSpec("rank", None, integer=True, rank=True),
    "nccl-init-hang": FaultSpec("", 0.0),
}


@dataclass(frozen=True)
class Faults:
    """The active faults and their values."""

    values: dict[str, float] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.values

    def __bool__(self) -> bool:
        return bool(self.values)

    def value(self, name: str) -> float:
        return self.values[name]


def parse_inject(raw: str) -> dict[str, float]:
    """'hang=2,bad-json' -> {'hang': 2.0, 'bad-json': 0.0}; argparse shows the error and exits 2."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, has_value, text = item.partition("=")
        spec = FAULTS.get(name)
        if spec is None:
            raise argparse.ArgumentTypeError(f"unknown fault {name!r} (known: {', '.join(FAULTS)})")
        if not has_value:
            if spec.default is None:
                raise argparse.ArgumentTypeError(f"fault {name!r} needs a value: {name}={spec.value.upper()}")
            out[name] = float(spec.default)
            continue
        if spec.value == "":
            raise argparse.ArgumentTypeError(f"fault {name!r} takes no value")
        text, has_after, after = text.partition("@") if spec.rank else (text, "", "")
        if has_after and "@" not in spec.value:
            raise argparse.ArgumentTypeError(f"fault {name} takes a rank only, not {text}@{after}")
        try:
            value = float(int(text)) if spec.integer else float(text)
            after_value = float(int(after)) if has_after else None
        except ValueError:
            kind = "an integer" if spec.integer else "a number"
            raise argparse.ArgumentTypeError(f"fault {name}: {text!r} is not {kind}") from None
        too_low = value < 0 or (spec.integer and not spec.rank and value < 1)
        if too_low or (after_value is not None and after_value < 1):
            raise argparse.ArgumentTypeError(f"fault {name}: {text!r} is out of range")
        out[name] = value
        if after_value is not None:
            out[f"{name}@"] = after_value
    return out


_active = Faults()


def active() -> Faults:
    """The faults of this process (set once, before the serving modules are imported)."""
    return _active


def activate_from_argv(argv: Sequence[str]) -> Faults:
    """Read --inject before argument parsing: import-time faults fire before SGLang parses its args.

    A bad --inject is ignored here; the real parser reports it (exit 2) right after.
    """
    global _active
    values: dict[str, float] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--inject" and i + 1 < len(args):
            raw = args[i + 1]
        elif arg.startswith("--inject="):
            raw = arg.partition("=")[2]
        else:
            continue
        try:
            values.update(parse_inject(raw))
        except argparse.ArgumentTypeError:
            continue
    _active = Faults(values)
    if "missing-soundfile" in _active:
        time.sleep(_active.value("missing-soundfile"))  # real: ~29 s of imports before it fails
    if "xgrammar-structural-tag" in _active:
        time.sleep(_active.value("xgrammar-structural-tag"))
        # An xgrammar without StructuralTag (xgrammar 0.1.10 on the seed host); shadows a real one.
        sys.path.insert(0, str(FAULT_SITE))
        sys.modules.pop("xgrammar", None)
    return _active


def path_without(module: str) -> list[str]:
    """Drop the sys.path entries an installed ``module`` would be found in; return the old sys.path.

    A fault-only helper: the next ``import module`` then fails inside the import system, with
    Python's own ``ModuleNotFoundError: No module named '...'`` and no extra frames.
    """
    saved = list(sys.path)
    sys.modules.pop(module, None)
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.origin:
        home = Path(spec.origin).parent
        if spec.submodule_search_locations:  # a package: its parent directory holds it
            home = home.parent
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != home.resolve()]
    return saved


def kill_process_tree(*, include_parent: bool) -> None:
    """SGLang's last words before it SIGKILLs itself (shell status 137, systemd status=9/KILL)."""
    pid = os.getpid()
    logger.info("kill_process_tree called: parent_pid=%d, include_parent=%s, pid=%d", pid,
                include_parent, pid)
    if include_parent:
        kill_self()


def kill_self() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def scheduler_segfaulted(child_pid: int, seconds_until_death: float) -> None:
    """A scheduler child killed by SIGSEGV while serving (H200 run 4): SGLang's watchdog (utils/watchdog.py)
    names the child and its exit code, then the main process kills its own tree (SIGKILL, no traceback)."""
    logger.error("Subprocess scheduler_0 (pid=%d) crashed with exit code -11. Triggering SIGQUIT for "
                 "cleanup...", child_pid)
    scheduler_died_at_runtime(seconds_until_death)


def scheduler_died_at_runtime(seconds_until_death: float) -> None:
    """What the main process logs after a scheduler failure while serving, then its death."""
    logger.info("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
    logger.info("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
    time.sleep(seconds_until_death)  # real: 5 s; configurable so tests stay fast
    logger.info("No live scheduler processes found; skipping py-spy and CUDA coredump.")
    kill_process_tree(include_parent=True)


def scheduler_died_at_startup() -> None:
    """What the main process logs when the scheduler fails during start-up, then its death."""
    logger.error("Received sigquit from a child process. It usually means the child failed.")
    kill_process_tree(include_parent=True)
