"""The cold start against its budgets: `[floors.SERVICE]` `cold_start_s` (the whole wait, up to the first
sampled answer) and `<phase>_s` (one phase: from the previous phase's end to this one's; the phases of
ReadyReport.phases, services/phases.py), so a deploy gate fails a host whose start-up regressed
(docs/profiles.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pytest_dflash.config.tables.floors import COLD_START_FLOORS
from pytest_dflash.run import skips

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

__all__ = ["cold_start_within_budgets", "judge_cold_start", "phase_durations"]


def phase_durations(phases: Mapping[str, float]) -> dict[str, float]:
    """Each phase's duration: its end minus the previous phase's end (the first from the start of
    the wait)."""
    out: dict[str, float] = {}
    previous = 0.0
    for name, end in phases.items():
        out[name] = round(max(0.0, end - previous), 3)
        previous = max(previous, end)
    return out


def judge_cold_start(phases: Mapping[str, float], budgets: Mapping[str, float | str]) -> list[str]:
    """The budgets (cold-start floors) this cold start broke, one line each; a budget on a phase this start-up
    did not show (no such log line, e.g. CUDA graphs off) is one too: it cannot be judged, so it does
    not pass."""
    durations = phase_durations(phases)
    problems: list[str] = []
    for key in COLD_START_FLOORS:
        budget = budgets.get(key)
        if not isinstance(budget, int | float):
            continue
        if key == "cold_start_s":
            total = phases.get("first_sampled")
            if total is None:
                problems.append(f"cold_start_s {budget:g}: no first sampled answer in this cold start")
            elif total > budget:
                problems.append(f"cold start took {total:.1f}s (until the first sampled answer), "
                                f"budget cold_start_s = {budget:g}")
            continue
        phase = key.removesuffix("_s")
        if phase not in durations:
            problems.append(f"{key} {budget:g}: this start-up showed no {phase!r} phase (no such line in the "
                            "service's log: e.g. CUDA graphs off, or no log to read), so it cannot be judged")
        elif durations[phase] > budget:
            problems.append(f"phase {phase} took {durations[phase]:.1f}s (ended at {phases[phase]:.1f}s), "
                            f"budget {key} = {budget:g}")
    return problems


def cold_start_within_budgets(service: ServiceHandle) -> None:
    """The service's cold start within the cold-start budgets of its [floors.SERVICE] (skips without any, and
    for a service this run did not start: an attached server had no cold start here)."""
    __tracebackhide__ = True
    floors = service.host.profile.floors.get(service.name, {})
    budgets = {key: floors[key] for key in COLD_START_FLOORS if key in floors}
    if not budgets:
        skips.not_applicable(f"{service.label}: no cold-start budget ([floors.{service.name}] cold_start_s "
                    "or <phase>_s)")
    if not service.manager.provisioned:
        skips.not_applicable(f"{service.label}: not started by this run (attached): no cold start to judge")
    report = service.ensure_ready()
    shown = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in phase_durations(report.phases).items())
    if problems := judge_cold_start(report.phases, budgets):
        raise AssertionError(f"{service.label}: cold start over budget: " + "; ".join(problems)
                             + f" (phases: {shown})")
