"""How many GPUs a service's command spans (SGLang's parallelism flags), and whether its `gpus` agree.

SGLang 0.5.17 (`server_args.py`): `--tensor-parallel-size/--tp-size`, `--pipeline-parallel-size/--pp-size`,
`--data-parallel-size/--dp-size` (each default 1), `--enable-dp-attention` (the DP ranks then share the TP
GPUs), `--nnodes` (the ranks spread over that many hosts), `--base-gpu-id` and `--gpu-id-step` (which of the
visible GPUs the ranks take). argparse also takes an unambiguous prefix such as `--tp`, and `--flag=value`.
A scheduler rank `i` runs on visible GPU `base_gpu_id + i * gpu_id_step`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_SIZE_FLAGS = {
    "tp": ("--tensor-parallel-size", "--tp-size", "--tp"),
    "pp": ("--pipeline-parallel-size", "--pp-size", "--pp"),
    "dp": ("--data-parallel-size", "--dp-size", "--dp"),
    "nnodes": ("--nnodes",),
    "base_gpu_id": ("--base-gpu-id",),
    "gpu_id_step": ("--gpu-id-step",),
}
# Commands whose parallelism flags default to 1 when absent: without a flag, a wrapper script says nothing.
_SERVER_MODULES = ("sglang.launch_server", "pytest_dflash.refserver")
_DEFAULTS = {"tp": 1, "pp": 1, "dp": 1, "nnodes": 1, "base_gpu_id": 0, "gpu_id_step": 1}


class LayoutError(ValueError):
    """A parallelism flag whose value is not a positive integer (or a non-negative one for --base-gpu-id)."""


@dataclass(frozen=True)
class ParallelLayout:
    """The parallelism a command asks for; `flags` says which were given, as written (for messages)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = False
    nnodes: int = 1
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    flags: tuple[str, ...] = ()
    server: bool = True  # the command starts SGLang's server (or the refserver), so no flag means 1 GPU

    @property
    def ranks(self) -> int:
        """Scheduler processes on this host (SGLang's `sglang::scheduler_TP{i}` ...)."""
        copies = 1 if self.dp_attention else self.dp
        return max(1, self.tp * self.pp * copies // self.nnodes)

    @property
    def gpus_needed(self) -> int:
        """Visible GPUs the ranks on this host use: rank i takes base_gpu_id + i * gpu_id_step."""
        return self.base_gpu_id + (self.ranks - 1) * self.gpu_id_step + 1

    def describe(self) -> str:
        """'--tp-size 4 x --pp-size 1 ...' as the command says it, or 'no parallelism flag (1 GPU)'."""
        if not self.flags:
            return "no --tp-size/--dp-size/--pp-size (1 GPU)"
        return " ".join(self.flags) + f" ({self.ranks} rank(s) on this host)"


def _value(argv: Sequence[str], index: int, arg: str) -> tuple[str, str]:
    if "=" in arg:
        flag, _, raw = arg.partition("=")
        return flag, raw
    raw = argv[index + 1] if index + 1 < len(argv) else ""
    return arg, raw


def parse_layout(argv: Sequence[str]) -> ParallelLayout:
    """The layout `argv` (a server command) asks for. A placeholder or a non-number raises LayoutError."""
    values = dict(_DEFAULTS)
    given: list[str] = []
    dp_attention = False
    for index, arg in enumerate(argv):
        if arg == "--enable-dp-attention":
            dp_attention = True
            given.append(arg)
            continue
        name = arg.partition("=")[0]
        key = next((k for k, names in _SIZE_FLAGS.items() if name in names), None)
        if key is None:
            continue
        flag, raw = _value(argv, index, arg)
        try:
            number = int(raw)
        except ValueError:
            raise LayoutError(f"{flag} {raw!r} is not an integer") from None
        floor = 0 if key == "base_gpu_id" else 1
        if number < floor:
            raise LayoutError(f"{flag} {number} is below {floor}")
        values[key] = number
        given.append(f"{flag} {number}")
    if dp_attention and values["dp"] > 1 and values["tp"] % values["dp"]:
        raise LayoutError(f"--enable-dp-attention needs --dp-size {values['dp']} to divide "
                          f"--tp-size {values['tp']}")
    return ParallelLayout(tp=values["tp"], pp=values["pp"], dp=values["dp"], dp_attention=dp_attention,
                          nnodes=values["nnodes"], base_gpu_id=values["base_gpu_id"],
                          gpu_id_step=values["gpu_id_step"], flags=tuple(given),
                          server=_starts_a_server(argv))


def _starts_a_server(argv: Sequence[str]) -> bool:
    names = [a.rsplit("/", 1)[-1] for a in argv]
    return (any(a in _SERVER_MODULES for a in argv)
            or any(n == "sglang" and nxt == "serve" for n, nxt in itertools.pairwise(names)))


def visible_devices(env: Mapping[str, str] | None) -> tuple[int, ...] | None:
    """CUDA_VISIBLE_DEVICES as indices; None when unset, or when it names GPUs by UUID (not comparable)."""
    raw = (env or {}).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def gpus_disagree(layout: ParallelLayout, gpus: Sequence[int]) -> str | None:
    """Why a service's `gpus` list and its command's layout disagree, or None. An empty list says nothing."""
    if not gpus:
        return None
    if not layout.flags and not layout.server:
        return None  # a wrapper script: its flags are not on this command line
    if len(set(gpus)) != len(gpus):
        return f"gpus {list(gpus)} names a GPU twice"
    if len(gpus) != layout.gpus_needed:
        return (f"gpus {list(gpus)} lists {len(gpus)} GPU(s) but the command's {layout.describe()} "
                f"uses {layout.gpus_needed}")
    return None


def visible_disagree(gpus: Sequence[int], visible: Sequence[int] | None) -> str | None:
    """Why CUDA_VISIBLE_DEVICES (as the service's environment sets it) and `gpus` disagree, or None."""
    if not gpus or visible is None or tuple(visible) == tuple(gpus):
        return None
    return (f"CUDA_VISIBLE_DEVICES={','.join(map(str, visible))} but gpus {list(gpus)}: the service would "
            "run on other GPUs than the profile says")


def gpu_environment(gpus: Sequence[int]) -> dict[str, str]:
    """The environment a service's `gpus` list gives its server: CUDA_VISIBLE_DEVICES in the listed order (so
    rank i of a TP service runs on the i-th listed GPU); nothing when the profile lists none."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)} if gpus else {}
