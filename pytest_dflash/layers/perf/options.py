"""The perf layer's options, read once at configure time into `PerfOptions` (a bad value is a one-line
usage error).

Declared with every other option in pytest_dflash/config/options.py; each is also an ini key (dflash_ prefix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_dflash.config import options
from pytest_dflash.layers.parity.hooks import allow_state_changes
from pytest_dflash.layers.perf.settings import PerfOverrides
from pytest_dflash.load.workload import BUILTIN_NAME, DatasetError, dataset_path, load_dataset

__all__ = ["PerfOptions", "options_from_config"]


@dataclass(frozen=True)
class PerfOptions:
    update_baseline: bool = False
    baseline_dir: Path = Path("reports/baselines")
    overrides: PerfOverrides = field(default_factory=PerfOverrides)
    allow_state_changes: bool = False  # --allow-state-changes (declared by the parity layer's hooks)
    tpot_ceiling_ms: float | None = None  # --tpot-ceiling-ms; None: the default / the profile's
    tpot_ceiling_off: bool = False
    sweep: tuple[int, ...] | None = None  # --perf-sweep 1,4,16: a one-off sweep at these levels


def _ceiling(config: pytest.Config) -> tuple[float | None, bool]:
    raw = options.text(config, "dflash_tpot_ceiling_ms")
    if not raw:
        return None, False
    if raw.lower() in ("off", "none", "no"):
        return None, True
    try:
        value = float(raw.removesuffix("ms"))
    except ValueError:
        raise pytest.UsageError(f"{options.where('dflash_tpot_ceiling_ms')}: {raw!r} is not a number of "
                                "milliseconds (or 'off')") from None
    if not math.isfinite(value):  # 'nan', 'inf': no request could pass or fail such a ceiling
        raise pytest.UsageError(f"{options.where('dflash_tpot_ceiling_ms')}: {raw!r} is not a finite number")
    if not value > 0:
        raise pytest.UsageError(f"{options.where('dflash_tpot_ceiling_ms')}: {raw!r} must be > 0")
    return value, False


def _dataset(config: pytest.Config) -> str | None:
    """--perf-dataset PATH (or 'builtin'), read and checked now: a bad file is a one-line usage error."""
    raw = options.text(config, "dflash_perf_dataset")
    if not raw:
        return None
    path = dataset_path(raw) if raw == BUILTIN_NAME else options.path(config, "dflash_perf_dataset")
    assert path is not None
    try:
        load_dataset(path)
    except DatasetError as exc:
        raise pytest.UsageError(f"{options.where('dflash_perf_dataset')}: {exc}") from None
    return str(path.resolve())


def _sweep(config: pytest.Config) -> tuple[int, ...] | None:
    """--perf-sweep 1,4,16: concurrency levels (a one-line usage error for anything else, rates too)."""
    from pytest_dflash.config.tables.perf import parse_sweep_levels

    raw = options.text(config, "dflash_perf_sweep")
    if not raw:
        return None
    levels = parse_sweep_levels(raw)
    if isinstance(levels, str):
        raise pytest.UsageError(f"{options.where('dflash_perf_sweep')}: {levels}")
    return levels


def options_from_config(config: pytest.Config) -> PerfOptions:
    ceiling, ceiling_off = _ceiling(config)
    return PerfOptions(
        update_baseline=options.flag(config, "dflash_update_baseline"),
        # beside the run's other files: --dflash-report elsewhere takes the baselines with it
        baseline_dir=(options.path(config, "dflash_baseline_dir")
                      or options.report_dir(config) / "baselines"),
        overrides=PerfOverrides(
            requests=options.number(config, "dflash_perf_requests", int, None, low=1),
            duration_s=options.duration(config, "dflash_perf_duration", None),
            concurrency=options.number(config, "dflash_perf_concurrency", int, None, low=1),
            warmup=options.number(config, "dflash_perf_warmup", int, None, low=0),
            client_procs=options.number(config, "dflash_perf_client_procs", int, None, low=1),
            dataset=_dataset(config),
        ),
        allow_state_changes=allow_state_changes(config),
        tpot_ceiling_ms=ceiling,
        tpot_ceiling_off=ceiling_off,
        sweep=_sweep(config),
    )
