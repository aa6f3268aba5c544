"""pytest hooks of the generation and parity layers: their settings (declared in config/options.py)
and fixtures.

Registered through pytest_dflash.plugin.pytest_plugins. Every option is also an ini key (dflash_ prefix).

    pytest --host local suites/generation suites/parity
    pytest --host ct200 --provision suites/parity --parity-prompts prompts.json --parity-tie-gap 0.01
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_dflash.config import options
from pytest_dflash.config.options import number
from pytest_dflash.layers.parity.distribution import DEFAULT_ALPHA, DEFAULT_MIN_SAMPLES, DrawPlan
from pytest_dflash.layers.parity.prompts import BUILTIN_PROMPTS, Prompt, load_prompts

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

DEFAULT_MAX_TOKENS = 64  # tokens of each prompt's greedy parity comparison (--parity-max-tokens)

# Open-ended prompts, so the first tokens vary at temperature 1 on any model: distribution parity.
DISTRIBUTION_PROMPTS: tuple[str, ...] = (
    "Once upon a time, in a land far away,",
    "The name of my cat is",
    "Here is a random number:",
)


@dataclass(frozen=True)
class LayerOptions:
    """The generation and parity layers' settings, parsed once per run."""

    extra_prompts: tuple[Prompt, ...] = ()
    max_tokens: int = DEFAULT_MAX_TOKENS
    tie_gap: float | None = None  # None: the profile's
    max_tie_rate: float | None = None
    noise_gap: float | None = None  # None: the profile's
    plain_port: int | None = None
    draw: DrawPlan = field(default_factory=DrawPlan)
    alpha: float = DEFAULT_ALPHA
    min_samples: int = DEFAULT_MIN_SAMPLES
    accept_ratio: float | None = 1.0  # None: check off
    concurrency: int = 16
    long_prompt_tokens: int | None = None
    allow_state_changes: bool = False  # --allow-state-changes: /flush_cache also on attached servers

    def prompts(self, profile_prompts: Path | None = None) -> list[Prompt]:
        """The built-in prompts, the profile's [parity] prompts file, then --parity-prompts."""
        out = list(BUILTIN_PROMPTS)
        if profile_prompts is not None:
            try:
                out += load_prompts(profile_prompts)
            except ValueError as exc:
                pytest.fail(f"[parity] prompts: {exc}", pytrace=False)
        return out + list(self.extra_prompts)


OPTIONS_KEY = pytest.StashKey[LayerOptions]()
CACHE_KEY = pytest.StashKey[dict[tuple[str, ...], Any]]()


def allow_state_changes(config: pytest.Config) -> bool:
    """--allow-state-changes, else the ini key dflash_allow_state_changes."""
    return options.flag(config, "dflash_allow_state_changes")


def state_change_refusal(handle: ServiceHandle, *, allowed: bool) -> str | None:
    """Why a state-changing request (POST /flush_cache) may not be sent to `handle`'s server, or None.

    A server this run started (provisioned, or derived for triage) is the run's own; any other one is attached
    and may be serving production: it is left as it was unless the user opted in.
    """
    if allowed or handle.manager.provisioned:
        return None
    return (f"{handle.label} was not started by this run (attach mode), and POST /flush_cache changes "
            "its state; "
            + options.opt_in_hint("dflash_allow_state_changes"))


def options_from_config(config: pytest.Config) -> LayerOptions:
    extra: tuple[Prompt, ...] = ()
    path = options.path(config, "dflash_parity_prompts")
    if path is not None:
        try:
            extra = tuple(load_prompts(path))
        except ValueError as exc:
            raise pytest.UsageError(f"{options.where('dflash_parity_prompts')}: {exc}") from None
    plan = DrawPlan(
        count=number(config, "dflash_dist_samples", int, DEFAULT_MIN_SAMPLES, low=1),
        tokens=number(config, "dflash_dist_tokens", int, 4, low=1, high=64),
        temperature=number(config, "dflash_dist_temperature", float, 1.0, low=0.05, high=5),
        seed=number(config, "dflash_dist_seed", int, 0, low=0),
    )
    return LayerOptions(
        extra_prompts=extra,
        max_tokens=number(config, "dflash_parity_max_tokens", int, DEFAULT_MAX_TOKENS, low=1),
        tie_gap=number(config, "dflash_parity_tie_gap", float, None, low=0),
        max_tie_rate=number(config, "dflash_parity_max_tie_rate", float, None, low=0, high=1),
        noise_gap=number(config, "dflash_parity_noise_gap", float, None, low=0),
        plain_port=number(config, "dflash_parity_plain_port", int, None, low=1, high=65535),
        draw=plan,
        alpha=number(config, "dflash_dist_alpha", float, DEFAULT_ALPHA, low=1e-12, high=0.5),
        accept_ratio=number(config, "dflash_ddtree_accept_ratio", float, 1.0, low=0, allow_off=True),
        concurrency=number(config, "dflash_gen_concurrency", int, 16, low=1, high=512),
        long_prompt_tokens=number(config, "dflash_long_prompt_tokens", int, None, low=16),
        allow_state_changes=allow_state_changes(config),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[OPTIONS_KEY] = options_from_config(config)
    config.stash[CACHE_KEY] = {}


@pytest.fixture
def dflash_layer_options(request: pytest.FixtureRequest) -> LayerOptions:
    """Settings of the generation and parity layers (--parity-*, --dist-*, --gen-*, ...)."""
    return request.config.stash[OPTIONS_KEY]


@pytest.fixture
def dflash_run_cache(request: pytest.FixtureRequest) -> dict[tuple[str, ...], Any]:
    """Results worth reusing within one run (a reference's greedy outputs and samples), keyed by tuples."""
    return request.config.stash[CACHE_KEY]
