"""pytest hooks of the generation and parity layers: their options and fixtures.

Registered through pytest_dflash.plugin.pytest_plugins. Every option is also an ini key (dflash_ prefix).

    pytest --host local suites/generation suites/parity
    pytest --host ct200 --provision suites/parity --parity-prompts prompts.json --parity-tie-gap 0.01
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_dflash.config.options import add_text_options, option_source, option_text
from pytest_dflash.layers.parity.distribution import DEFAULT_ALPHA, DEFAULT_MIN_SAMPLES, DrawPlan
from pytest_dflash.layers.parity.greedy import BUILTIN_PROMPTS, DEFAULT_MAX_TOKENS, Prompt, load_prompts

if TYPE_CHECKING:
    from pytest_dflash.run.state import ServiceHandle

PROMPTS_HELP = ("extra prompts for the parity layer (added to the built-in set): a .json list of strings or "
                "{\"name\", \"text\"} objects, or a text file with one prompt per line")
MAX_TOKENS_HELP = f"greedy tokens compared per prompt in the parity layer (default {DEFAULT_MAX_TOKENS})"
TIE_GAP_HELP = ("logprob gap at or below which a divergence is a numerical tie (default: the profile's "
                "[parity] tie_gap, else 0.001)")
MAX_TIE_RATE_HELP = ("fraction of prompts allowed to diverge at numerical ties (default: the profile's [parity] "
                     "max_tie_rate, else 0.25)")
NOISE_GAP_HELP = ("a divergence within this many nats of the top logprob is numerical noise, counted with ties, "
                  "when the compared service gives the reference's token for the prompt sent again alone "
                  "(default: the profile's [parity] noise_gap, else 0.5)")
PLAIN_PORT_HELP = ("port of the plain (non-speculative) server the parity layer derives and starts under --provision "
                   "when the profile has none (default: the reference's port + 100; process services: a free port)")
DIST_SAMPLES_HELP = (f"samples per prompt and service for distribution parity (default {DEFAULT_MIN_SAMPLES}; fewer "
                     f"than {DEFAULT_MIN_SAMPLES} makes the test inconclusive, which fails it)")
DIST_TOKENS_HELP = "the first K tokens of every sample are compared in distribution parity (default 4)"
DIST_ALPHA_HELP = f"family-wise false-alarm rate of distribution parity per service pair (default {DEFAULT_ALPHA:g})"
DIST_TEMPERATURE_HELP = "sampling temperature of distribution parity (default 1.0)"
DIST_SEED_HELP = "first sampling seed of distribution parity (default 0; another value draws a fresh sample)"
ACCEPT_RATIO_HELP = ("DDTREE's mean accept length must be at least RATIO x DFLASH's on the same prompts "
                     "(default 1.0; 'off' disables the check)")
CONCURRENCY_HELP = "concurrent sampled requests in the generation layer's concurrency test (default 16)"
LONG_PROMPT_HELP = ("cap in tokens on the generation layer's long prompt (default: none, 90 percent of the served "
                    "context)")
ALLOW_STATE_CHANGES_FLAG = "--allow-state-changes"
ALLOW_STATE_CHANGES_HELP = ("send requests that change a server's state (POST /flush_cache before accept-length "
                            "measurements) also to servers this run did not start (attach mode); without it they are "
                            "never sent there: the perf run skips the server-side accept length, and an accept length "
                            "that needs a flush is skipped naming this option")

# Open-ended prompts, so the first tokens vary at temperature 1 on any model: distribution parity.
DISTRIBUTION_PROMPTS: tuple[str, ...] = (
    "Once upon a time, in a land far away,",
    "The name of my cat is",
    "Here is a random number:",
)

# Short everyday prompts for the accept-length numbers and DDTREE vs DFLASH (the parity set leans on long,
# code and repetitive text, where a linear draft does unusually well).
ACCEPTANCE_PROMPTS: tuple[str, ...] = (
    "The quick brown fox",
    "Hello world!",
    "The capital city of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "Speculative decoding drafts several tokens and verifies them in one pass.",
    "1, 2, 3, 4, 5,",
    "Q: What is the boiling point of water?\nA:",
    "Write a short poem about the sea.",
    "import numpy as np\n",
    "Dear Sir or Madam,",
    "The meeting is scheduled for",
    "In 1969, the first humans",
    "SELECT name FROM users WHERE",
    "My favourite word is",
    "Translate to French: good morning",
)

OPTIONS: tuple[tuple[str, str, str], ...] = (
    # (flag, dest / ini key, help)
    ("--parity-prompts", "dflash_parity_prompts", PROMPTS_HELP),
    ("--parity-max-tokens", "dflash_parity_max_tokens", MAX_TOKENS_HELP),
    ("--parity-tie-gap", "dflash_parity_tie_gap", TIE_GAP_HELP),
    ("--parity-max-tie-rate", "dflash_parity_max_tie_rate", MAX_TIE_RATE_HELP),
    ("--parity-noise-gap", "dflash_parity_noise_gap", NOISE_GAP_HELP),
    ("--parity-plain-port", "dflash_parity_plain_port", PLAIN_PORT_HELP),
    ("--dist-samples", "dflash_dist_samples", DIST_SAMPLES_HELP),
    ("--dist-tokens", "dflash_dist_tokens", DIST_TOKENS_HELP),
    ("--dist-alpha", "dflash_dist_alpha", DIST_ALPHA_HELP),
    ("--dist-temperature", "dflash_dist_temperature", DIST_TEMPERATURE_HELP),
    ("--dist-seed", "dflash_dist_seed", DIST_SEED_HELP),
    ("--ddtree-accept-ratio", "dflash_ddtree_accept_ratio", ACCEPT_RATIO_HELP),
    ("--gen-concurrency", "dflash_gen_concurrency", CONCURRENCY_HELP),
    ("--long-prompt-tokens", "dflash_long_prompt_tokens", LONG_PROMPT_HELP),
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


def pytest_addoption(parser: pytest.Parser) -> None:
    add_text_options(parser, OPTIONS)
    group = parser.getgroup("dflash")
    group.addoption(ALLOW_STATE_CHANGES_FLAG, action="store_true", dest="dflash_allow_state_changes", default=None,
                    help=ALLOW_STATE_CHANGES_HELP)
    parser.addini("dflash_allow_state_changes", ALLOW_STATE_CHANGES_HELP, type="bool", default=False)


def allow_state_changes(config: pytest.Config) -> bool:
    """--allow-state-changes, else the ini key dflash_allow_state_changes."""
    value = config.getoption("dflash_allow_state_changes")
    return bool(value if value is not None else config.getini("dflash_allow_state_changes"))


def state_change_refusal(handle: ServiceHandle, *, allowed: bool) -> str | None:
    """Why a state-changing request (POST /flush_cache) may not be sent to `handle`'s server, or None.

    A server this run started (provisioned, or derived for triage) is the run's own; any other one is attached and
    may be serving production: it is left as it was unless the user opted in.
    """
    if allowed or handle.manager.provisioned:
        return None
    return (f"{handle.label} was not started by this run (attach mode), and POST /flush_cache changes its state; "
            f"pass {ALLOW_STATE_CHANGES_FLAG} (ini dflash_allow_state_changes = true) to allow it")


def _where(dest: str) -> str:
    return option_source(OPTIONS, dest)


def _number(config: pytest.Config, dest: str, kind: type[int] | type[float], default: Any, *,
            low: float | None = None, high: float | None = None, allow_off: bool = False) -> Any:
    raw = option_text(config, dest)
    if not raw:
        return default
    if allow_off and raw.lower() in ("off", "none", "no"):
        return None
    try:
        value = kind(raw)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise pytest.UsageError(f"{_where(dest)}: {raw!r} is not {expected}") from None
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"[{low:g}, {high:g}]" if high is not None else f">= {low:g}"
        raise pytest.UsageError(f"{_where(dest)}: {raw!r} must be {span}")
    return value


def options_from_config(config: pytest.Config) -> LayerOptions:
    extra: tuple[Prompt, ...] = ()
    prompts_raw = option_text(config, "dflash_parity_prompts")
    if prompts_raw:
        path = Path(prompts_raw).expanduser()
        path = path if path.is_absolute() else config.invocation_params.dir / path
        try:
            extra = tuple(load_prompts(path))
        except ValueError as exc:
            raise pytest.UsageError(f"{_where('dflash_parity_prompts')}: {exc}") from None
    plan = DrawPlan(
        count=_number(config, "dflash_dist_samples", int, DEFAULT_MIN_SAMPLES, low=1),
        tokens=_number(config, "dflash_dist_tokens", int, 4, low=1, high=64),
        temperature=_number(config, "dflash_dist_temperature", float, 1.0, low=0.05, high=5),
        seed=_number(config, "dflash_dist_seed", int, 0, low=0),
    )
    return LayerOptions(
        extra_prompts=extra,
        max_tokens=_number(config, "dflash_parity_max_tokens", int, DEFAULT_MAX_TOKENS, low=1),
        tie_gap=_number(config, "dflash_parity_tie_gap", float, None, low=0),
        max_tie_rate=_number(config, "dflash_parity_max_tie_rate", float, None, low=0, high=1),
        noise_gap=_number(config, "dflash_parity_noise_gap", float, None, low=0),
        plain_port=_number(config, "dflash_parity_plain_port", int, None, low=1, high=65535),
        draw=plan,
        alpha=_number(config, "dflash_dist_alpha", float, DEFAULT_ALPHA, low=1e-12, high=0.5),
        accept_ratio=_number(config, "dflash_ddtree_accept_ratio", float, 1.0, low=0, allow_off=True),
        concurrency=_number(config, "dflash_gen_concurrency", int, 16, low=1, high=512),
        long_prompt_tokens=_number(config, "dflash_long_prompt_tokens", int, None, low=16),
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
