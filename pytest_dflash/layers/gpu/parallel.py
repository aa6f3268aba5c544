"""Env layer check: does each service's `gpus` list agree with the parallelism its command asks for?

A TP4 service whose profile lists two GPUs, or whose unit pins CUDA_VISIBLE_DEVICES to one, dies at start-up
(or worse, runs on another service's GPU); caught here from the command and environment as launched (the live
unit in attach mode), before anything starts. The profile loader already refuses a profile command that
disagrees (config/tables/services.py); this covers units and commands known only on the host.
"""

from __future__ import annotations

from pytest_dflash.config.parallel import (
    LayoutError,
    gpus_disagree,
    parse_layout,
    visible_devices,
    visible_disagree,
)
from pytest_dflash.layers.gpu.env import probe_groups
from pytest_dflash.layers.gpu.layer import GpuHost
from pytest_dflash.layers.gpu.report import explain
from pytest_dflash.layers.gpu.services import ServiceView
from pytest_dflash.run.skips import not_applicable


def layout_problems(view: ServiceView) -> tuple[str, list[str]]:
    """(what the service runs, as one line; what is wrong with its GPUs) for one service's launch."""
    try:
        layout = parse_layout(view.argv)
    except LayoutError as exc:
        return f"{view.name}: {exc}", [f"{view.name} ({view.source}): {exc}"]
    visible = visible_devices(view.env)
    shown = ",".join(map(str, view.gpus or visible or ())) or "unpinned"
    line = f"{view.name}: {layout.describe()} on GPUs {shown}"
    found = (gpus_disagree(layout, view.gpus), visible_disagree(view.gpus, visible))
    problems = [why for why in found if why]
    if not view.gpus and visible is not None and len(visible) < layout.gpus_needed:
        problems.append(f"CUDA_VISIBLE_DEVICES={','.join(map(str, visible))} shows {len(visible)} GPU(s) but "
                        f"the command's {layout.describe()} needs {layout.gpus_needed}")
    return line, [f"{view.name} ({view.source}): {p}" for p in problems]


def service_gpus_match_parallelism(gpu: GpuHost) -> None:
    """Each service's `gpus`, its CUDA_VISIBLE_DEVICES and its command's --tp-size / --dp-size / --pp-size
    agree: a TP service gets exactly the GPUs its ranks take, in the profile's order."""
    __tracebackhide__ = True
    probe_groups(gpu)  # skips without host access
    lines, problems = [], []
    for view in gpu.views:
        if not view.argv:
            continue
        line, wrong = layout_problems(view)
        lines.append(line)
        problems += wrong
    if not lines:
        not_applicable(f"no service of {gpu.host.name} has a launch command to read (units neither installed "
                       "nor templated)")
    assert not problems, explain(
        "a service's GPUs disagree with the parallelism its command asks for: it would fail at start-up "
        "(a rank without a GPU) or run on GPUs the profile gives another service",
        "\n".join([*problems, "--- as launched ---", *lines]))
    gpu.export("service_gpus", "; ".join(lines))
