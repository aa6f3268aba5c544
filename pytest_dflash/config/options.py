"""Options: every flag and ini key the plugin declares, and the one set of validators that read them.

Each option is a command-line flag and an ini key of the same name (dflash_ prefix); the command line wins.
The declarations are the tables below (`Opt`: flag, ini key, help, kind, ini default), registered together
by `add_options`; a layer turns the values into its typed settings with the validators here (`text`,
`number`, `duration`, `flag`, `path`), so a bad value is always a `pytest.UsageError` naming flag and ini key.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_dflash.config.durations import parse_seconds
from pytest_dflash.config.layers import LAYERS


def option_text(config: pytest.Config, dest: str) -> str:
    """The option's value as stripped text: the command line, else the ini key, else ''."""
    value = config.getoption(dest)
    if value is None:
        value = config.getini(dest)
    return str(value or "").strip()


# ---- the core options ----------------------------------------------------------------------------------

HOST_HELP = ("host profile to test: a name looked up in --hosts-dir (or the built-in 'local'), "
             "or a path to a .toml file; repeatable")
ATTACH_HELP = "attach to an already running OpenAI-compatible server at URL (no host access); repeatable"
ATTACH_LOG_COMMAND_HELP = ("a command on this machine printing the attached server's log, for failure "
                           "evidence, e.g. 'kubectl logs deploy/sglang --since-time={since}'; once for every "
                           "--attach, or once per --attach in order")
ATTACH_ALGORITHM_HELP = ("what the attached server serves, declared: its speculative algorithm (NONE, "
                         "DFLASH, DDTREE, ...); compared with /server_info, and a declared speculative "
                         "server that answers no /server_info (a gateway in front of it) makes its "
                         "accept-length checks 'could not check'; once for every --attach, or once per "
                         "--attach in order; default: read from /server_info")
PROVISION_HELP = ("deploy and start the profile's services (systemd units / processes) and remove them "
                  "afterwards; default: attach to the services already running")
KEEP_HELP = "leave provisioned services running after the run (for debugging)"
JOURNAL_LINES_HELP = "lines of service log / journal attached to each failure (default 200)"
HOSTS_DIR_HELP = "directory of host profiles (default: ./hosts)"
REPORT_HELP = "directory for verdict JSON files (default: reports)"
READY_TIMEOUT_HELP = "override every service's readiness budget (e.g. 90s, 15m)"
GATE_HELP = ("comma-separated layers that must pass on every host for exit code 0: every check the suites "
             "run define for them, none narrowed, skipped or left out; e.g. 'host,service,generation,parity' "
             "(see docs/gating.md)")
LOCK_WAIT_HELP = "how long to wait for another run's host lock before failing (default 10m)"
FLEET_HELP = ("test every host of a fleet: a folder of *.toml profiles, or an Ansible inventory FILE[:GROUP] "
              "(YAML, INI or a dynamic script; resolved by ansible-inventory when installed) whose hosts "
              "name a base profile in their dflash_profile var")
SHARD_HELP = "run only shard I of N of the hosts (1-based, deterministic by host name), e.g. --shard 2/8"
REQUEST_TIMEOUT_HELP = ("timeout of one HTTP request made by a test (default 60s; readiness has its own "
                        "budgets)")


def add_core_options(parser: pytest.Parser) -> None:
    """The core flags and ini keys (hosts, attach, provisioning, budgets, the gate, report dirs)."""
    group = parser.getgroup("dflash", "pytest-dflash: DFlash / DDTree inference host acceptance")
    group.addoption("--host", action="append", dest="dflash_hosts", default=None, metavar="NAME|PATH",
                    help=HOST_HELP)
    group.addoption("--attach", action="append", dest="dflash_attach", default=None, metavar="URL",
                    help=ATTACH_HELP)
    group.addoption("--attach-log-command", action="append", dest="dflash_attach_log_command", default=None,
                    metavar="CMD", help=ATTACH_LOG_COMMAND_HELP)
    group.addoption("--attach-algorithm", action="append", dest="dflash_attach_algorithm", default=None,
                    metavar="ALGORITHM", help=ATTACH_ALGORITHM_HELP)
    group.addoption("--provision", action="store_true", dest="dflash_provision", default=None,
                    help=PROVISION_HELP)
    group.addoption("--keep", action="store_true", dest="dflash_keep", default=None, help=KEEP_HELP)
    group.addoption("--journal-lines", dest="dflash_journal_lines", default=None, metavar="N",
                    help=JOURNAL_LINES_HELP)
    group.addoption("--hosts-dir", dest="dflash_hosts_dir", default=None, metavar="DIR", help=HOSTS_DIR_HELP)
    group.addoption("--dflash-report", dest="dflash_report", default=None, metavar="DIR", help=REPORT_HELP)
    group.addoption("--ready-timeout", dest="dflash_ready_timeout", default=None, metavar="DURATION",
                    help=READY_TIMEOUT_HELP)
    group.addoption("--gate", dest="dflash_gate", default=None, metavar="LAYERS", help=GATE_HELP)
    group.addoption("--lock-wait", dest="dflash_lock_wait", default=None, metavar="DURATION",
                    help=LOCK_WAIT_HELP)
    group.addoption("--request-timeout", dest="dflash_request_timeout", default=None, metavar="DURATION",
                    help=REQUEST_TIMEOUT_HELP)
    group.addoption("--fleet", action="append", dest="dflash_fleet", default=None, metavar="DIR|FILE[:GROUP]",
                    help=FLEET_HELP)
    group.addoption("--shard", dest="dflash_shard", default=None, metavar="I/N", help=SHARD_HELP)
    parser.addini("dflash_hosts", HOST_HELP, type="linelist", default=[])
    parser.addini("dflash_attach", ATTACH_HELP, type="linelist", default=[])
    parser.addini("dflash_attach_log_command", ATTACH_LOG_COMMAND_HELP, type="linelist", default=[])
    parser.addini("dflash_attach_algorithm", ATTACH_ALGORITHM_HELP, type="linelist", default=[])
    parser.addini("dflash_provision", PROVISION_HELP, type="bool", default=False)
    parser.addini("dflash_keep", KEEP_HELP, type="bool", default=False)
    parser.addini("dflash_journal_lines", JOURNAL_LINES_HELP, default="200")
    parser.addini("dflash_hosts_dir", HOSTS_DIR_HELP, default="hosts")
    parser.addini("dflash_report", REPORT_HELP, default="reports")
    parser.addini("dflash_ready_timeout", READY_TIMEOUT_HELP, default="")
    parser.addini("dflash_gate", GATE_HELP, default=None)  # None: not set; '' set but blank (a usage error)
    parser.addini("dflash_lock_wait", LOCK_WAIT_HELP, default="10m")
    parser.addini("dflash_request_timeout", REQUEST_TIMEOUT_HELP, default="60s")
    parser.addini("dflash_fleet", FLEET_HELP, type="linelist", default=[])
    parser.addini("dflash_shard", SHARD_HELP, default="")


def option(config: pytest.Config, name: str) -> Any:
    """Command line first, then the ini key of the same name."""
    value = config.getoption(name)
    if value is None or value == []:
        value = config.getini(name)
    return value


def testinfra_hosts_hint(config: pytest.Config) -> str:
    """' (--hosts X is testinfra's option: did you mean --host X?)' when testinfra's --hosts was given (a
    user who meant this plugin's --host types it easily); else ''."""
    given = getattr(config.option, "hosts", None)  # testinfra's dest; absent when testinfra is not installed
    if not given:
        return ""
    value = given if isinstance(given, str) else ",".join(map(str, given))
    return f" (--hosts {value} is testinfra's option: did you mean --host {value.split(',')[0]}?)"


def gate_layers(config: pytest.Config) -> list[str]:
    """--gate / dflash_gate as layers. Given but blank (`--gate ' '`, `dflash_gate =`) is a usage error: a
    pipeline that means to gate must never be switched off silently by an empty variable."""
    given = config.getoption("dflash_gate")
    if given is None:
        given = config.getini("dflash_gate")
    raw = str(given or "")
    layers = [part.strip() for part in raw.split(",") if part.strip()]
    if given is not None and not layers:
        raise pytest.UsageError(f"--gate / dflash_gate: {raw!r} names no layer (layers: {', '.join(LAYERS)})")
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown:
        raise pytest.UsageError(f"--gate / dflash_gate: unknown layer {unknown[0]!r} (layers: "
                                f"{', '.join(LAYERS)})")
    return layers


# Run shapes that run no test body: (pytest's option dest, the flags that set it). --setup-plan first: it
# also sets setuponly.
NO_TEST_BODY = (("setupplan", ("--setup-plan",)), ("setuponly", ("--setup-only",)),
                ("collectonly", ("--collect-only", "--co", "--collectonly")),
                ("showfixtures", ("--fixtures", "--funcargs")),
                ("show_fixtures_per_test", ("--fixtures-per-test",)))


def gate_without_test_bodies(config: pytest.Config) -> pytest.UsageError | None:
    """The usage error of a --gate / dflash_gate given to a run that runs no test body (--co, --setup-only,
    --setup-plan, --fixtures...): such a run tests nothing, so it must not open a gate. None otherwise."""
    given = config.getoption("dflash_gate")
    if given is None:
        given = config.getini("dflash_gate")
    if not str(given or "").strip():
        return None
    for dest, flags in NO_TEST_BODY:
        if config.getoption(dest, False):
            addopts = os.environ.get("PYTEST_ADDOPTS", "").split()
            where = " (from PYTEST_ADDOPTS)" if any(a.split("=")[0] in flags for a in addopts) else ""
            return pytest.UsageError(f"--gate / dflash_gate {str(given).strip()!r} with {flags[0]}{where}: "
                                     "a run that runs no test body tests nothing and cannot open a gate")
    return None


def report_dir(config: pytest.Config) -> Path:
    path = Path(str(option(config, "dflash_report")))
    return path if path.is_absolute() else config.invocation_params.dir / path


# ---- the declarations ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Opt:
    """One option: `--flag` on the command line, `dest` as the ini key. kind: "text" (a value), "flag" (a
    switch that turns something on, ini bool default false) or "off" (a --no-... switch, ini bool default
    true)."""

    flag: str
    dest: str
    help: str
    kind: Literal["text", "flag", "off"] = "text"
    ini_default: str = ""
    metavar: str | None = None


GPU_OPTIONS: tuple[Opt, ...] = (
    Opt("--save-env-snapshot", "dflash_save_env_snapshot",
        "write the env layer's package/driver snapshot of every host to FILE (JSON)", metavar="FILE"),
    Opt("--env-baseline", "dflash_env_baseline",
        "fail the env layer when a host's serving stack differs from the snapshot in FILE", metavar="FILE"),
    Opt("--dflash-probe-dump", "dflash_probe_dump",
        "write every probe's raw JSON output under DIR/<host>/ (evidence, test data)", metavar="DIR"),
    Opt("--jit-arch-list", "dflash_jit_arch_list",
        "FLASHINFER_CUDA_ARCH_LIST for the kernels layer's compile step on hosts without a GPU (default "
        "'9.0'; the service's own FLASHINFER_CUDA_ARCH_LIST wins)", ini_default="9.0", metavar="LIST"),
    Opt("--jit-objects", "dflash_jit_objects",
        "compile only these sources of each FlashInfer module on hosts without a GPU, e.g. 'renorm' "
        "(comma-separated; a cheaper compile-only check, no link)", metavar="NAMES"),
    Opt("--jit-jobs", "dflash_jit_jobs",
        "parallel compile jobs for the kernels layer's JIT builds (default: ninja's, or MAX_JOBS)",
        metavar="N"),
    Opt("--kernels-timeout", "dflash_kernels_timeout",
        "deadline for one cold JIT build + run in the kernels layer (default 25m)", ini_default="25m",
        metavar="DURATION"),
    Opt("--allow-gpu-use", "dflash_allow_gpu_use",
        "let the kernels layer build and launch kernels on the host's GPUs in attach mode (next to the "
        "running services); without it those tests skip. With --provision they always run", kind="flag"),
)

GENERATION_PARITY_OPTIONS: tuple[Opt, ...] = (
    Opt("--parity-prompts", "dflash_parity_prompts",
        "extra prompts for the parity layer (added to the built-in set): a .json list of strings or "
        "{\"name\", \"text\"} objects, or a text file with one prompt per line"),
    Opt("--parity-max-tokens", "dflash_parity_max_tokens",
        "greedy tokens compared per prompt in the parity layer (default 64)"),
    Opt("--parity-tie-gap", "dflash_parity_tie_gap",
        "logprob gap at or below which a divergence is a numerical tie (default: the profile's [parity] "
        "tie_gap, else 0.001)"),
    Opt("--parity-max-tie-rate", "dflash_parity_max_tie_rate",
        "fraction of prompts allowed to diverge at numerical ties (default: the profile's [parity] "
        "max_tie_rate, else 0.25)"),
    Opt("--parity-noise-gap", "dflash_parity_noise_gap",
        "a divergence within this many nats of the top logprob is numerical noise, counted with ties, when "
        "the compared service gives the reference's token for the prompt sent again alone (default: the "
        "profile's [parity] noise_gap, else 0.5)"),
    Opt("--parity-plain-port", "dflash_parity_plain_port",
        "port of the plain (non-speculative) server the parity layer derives and starts under --provision "
        "when the profile has none (default: the reference's port + 100; process services: a free port)"),
    Opt("--dist-samples", "dflash_dist_samples",
        "samples per prompt and service for distribution parity (default 200; fewer than 200 makes the test "
        "inconclusive, which fails it)"),
    Opt("--dist-tokens", "dflash_dist_tokens",
        "the first K tokens of every sample are compared in distribution parity (default 4)"),
    Opt("--dist-alpha", "dflash_dist_alpha",
        "family-wise false-alarm rate of distribution parity per service pair (default 0.001)"),
    Opt("--dist-temperature", "dflash_dist_temperature",
        "sampling temperature of distribution parity (default 1.0)"),
    Opt("--dist-seed", "dflash_dist_seed",
        "first sampling seed of distribution parity (default 0; another value draws a fresh sample)"),
    Opt("--ddtree-accept-ratio", "dflash_ddtree_accept_ratio",
        "DDTREE's mean accept length must be at least RATIO x DFLASH's on the same prompts (default 1.0; "
        "'off' disables the check)"),
    Opt("--gen-concurrency", "dflash_gen_concurrency",
        "concurrent sampled requests in the generation layer's concurrency test (default 16)"),
    Opt("--long-prompt-tokens", "dflash_long_prompt_tokens",
        "cap in tokens on the generation layer's long prompt (default: none, 90 percent of the served "
        "context)"),
    Opt("--allow-state-changes", "dflash_allow_state_changes",
        "send requests that change a server's state (POST /flush_cache before accept-length measurements) "
        "also to servers this run did not start (attach mode); without it they are never sent there: the "
        "perf run skips the server-side accept length, and an accept length that needs a flush is skipped "
        "naming this option", kind="flag"),
)

PERF_OPTIONS: tuple[Opt, ...] = (
    Opt("--update-baseline", "dflash_update_baseline",
        "record this run of each perf-tested service as its baseline (only a run that passes its floors is "
        "recorded); without it, runs are compared with the recorded baseline", kind="flag"),
    Opt("--baseline-dir", "dflash_baseline_dir",
        "directory of perf baselines, <dir>/<host>/<service>.json (default: baselines/ in the "
        "--dflash-report directory, reports/baselines)",
        metavar="DIR"),
    Opt("--perf-requests", "dflash_perf_requests",
        "perf runs: measured requests per service (overrides the profile's [perf] requests / duration)"),
    Opt("--perf-duration", "dflash_perf_duration",
        "perf runs: duration per service, e.g. 60s (overrides the profile's [perf] requests / duration)"),
    Opt("--perf-concurrency", "dflash_perf_concurrency",
        "perf runs: requests in flight (overrides the profile's [perf] concurrency)"),
    Opt("--perf-warmup", "dflash_perf_warmup",
        "perf runs: warm-up requests, excluded from every number (overrides the profile's [perf] warmup)"),
    Opt("--perf-client-procs", "dflash_perf_client_procs",
        "perf runs: spread each load run over N client processes, each its own event loop and connection "
        "pool (overrides the profile's [perf] client_procs; default 1; at most the concurrency)"),
    Opt("--perf-dataset", "dflash_perf_dataset",
        "perf runs: send these prompts (cycled, in a seeded order) instead of synthetic words: a JSONL file "
        "of {\"prompt\"} / {\"category\", \"prompt\"} per line, ShareGPT's JSON list of {\"conversations\"}, "
        "or 'builtin' (the shipped chat/code/math/summarisation/multilingual set); overrides the profile's "
        "[perf] dataset; accept length is then also reported per category", metavar="PATH"),
    Opt("--perf-sweep", "dflash_perf_sweep",
        "perf runs: a load sweep at these concurrency levels, e.g. 1,4,16,64 (overrides the profile's [perf] "
        "sweep; closed loop: concurrency is the batch the GPU sees; no request-rate sweeps)",
        metavar="LEVELS"),
    Opt("--tpot-ceiling-ms", "dflash_tpot_ceiling_ms",
        "smoke: sanity ceiling in ms on the time per output token of one streamed request (default 250, or "
        "the service's largest itl_*/tpot_* floor when higher; 'off' disables it)"),
)

FLEET_OPTIONS: tuple[Opt, ...] = (
    Opt("--prometheus", "dflash_prometheus",
        "also write the run's Prometheus textfile (node_exporter textfile-collector format, atomic) to FILE; "
        "the report dir always gets fleet.prom", metavar="FILE"),
    Opt("--prometheus-push", "dflash_prometheus_push",
        "also push the run's metrics to this Prometheus Pushgateway (PUT, 10 s timeout): http://HOST:9091 "
        "(job pytest-dflash) or a group URL http://HOST:9091/metrics/job/NAME[/LABEL/VALUE]...; a failed "
        "push is reported and does not change the exit code", metavar="URL"),
    Opt("--previous-summary", "dflash_previous_summary",
        "the previous fleet-summary.json to compare with (default: the one already in the report dir, e.g. "
        "restored from a CI cache)", metavar="FILE"),
    Opt("--dflash-history", "dflash_history",
        "folder of per-host last good verdicts (default: <report dir>/history)", metavar="DIR"),
    Opt("--fleet-concurrency", "dflash_fleet_concurrency",
        "without xdist: ready this many hosts' services at once before the first test (default 8; 1: host "
        "after host as the tests reach them)", ini_default="8", metavar="N"),
    Opt("--no-fleet-summary", "dflash_fleet_summary",
        "do not write the fleet summary, history and Prometheus file at the end of the run (ini "
        "dflash_fleet_summary = false)", kind="off"),
)

DECLARED: tuple[Opt, ...] = GPU_OPTIONS + GENERATION_PARITY_OPTIONS + PERF_OPTIONS + FLEET_OPTIONS


def add_options(parser: pytest.Parser) -> None:
    """Register every option of the plugin: the core ones, then each table above."""
    add_core_options(parser)
    group = parser.getgroup("dflash")
    for opt in DECLARED:
        if opt.kind in ("flag", "off"):
            action = "store_true" if opt.kind == "flag" else "store_false"
            group.addoption(opt.flag, action=action, dest=opt.dest, default=None, help=opt.help)
            parser.addini(opt.dest, opt.help, type="bool", default=opt.kind == "off")
        else:
            metavar = opt.metavar or opt.flag.rsplit("-", 1)[-1].upper()
            group.addoption(opt.flag, dest=opt.dest, default=None, metavar=metavar, help=opt.help)
            parser.addini(opt.dest, opt.help, default=opt.ini_default)


def flag_of(dest: str) -> str:
    """The command-line flag of an option, from its declaration (core flags follow the same naming rule)."""
    return next((o.flag for o in DECLARED if o.dest == dest),
                "--" + dest.removeprefix("dflash_").replace("_", "-"))


def where(dest: str) -> str:
    """'--flag / ini_key' of a declared option, for messages that say where a bad value came from."""
    return f"{flag_of(dest)} / {dest}"


def opt_in_hint(dest: str) -> str:
    """'pass --flag (ini key = true) to allow it': how to turn on a switch that guards a change on the
    host."""
    return f"pass {flag_of(dest)} (ini {dest} = true) to allow it"


def text(config: pytest.Config, dest: str) -> str:
    """The option's value as stripped text: the command line, else the ini key, else ''."""
    return option_text(config, dest)


def flag(config: pytest.Config, dest: str) -> bool:
    """A switch: the command line if given, else the ini key (bool)."""
    value = config.getoption(dest)
    return bool(value if value is not None else config.getini(dest))


def number(config: pytest.Config, dest: str, kind: type[int] | type[float], default: Any, *,
           low: float | None = None, high: float | None = None, allow_off: bool = False) -> Any:
    """An int or float option within [low, high]; '' -> default; 'off' -> None where allowed."""
    raw = option_text(config, dest)
    if not raw:
        return default
    if allow_off and raw.lower() in ("off", "none", "no"):
        return None
    try:
        value = kind(raw)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise pytest.UsageError(f"{where(dest)}: {raw!r} is not {expected}") from None
    if not math.isfinite(value):  # float('nan'), float('inf'), float('1e999'): no bound holds for them
        raise pytest.UsageError(f"{where(dest)}: {raw!r} is not a finite number")
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"[{low:g}, {high:g}]" if high is not None else f">= {low:g}"
        raise pytest.UsageError(f"{where(dest)}: {raw!r} must be {span}")
    return value


def duration(config: pytest.Config, dest: str, default: str | None, *,
             allow_zero: bool = False) -> float | None:
    """A positive duration option ('90s', '25m') in seconds, at most durations.MAX_SECONDS (7 days) (0 too
    where `allow_zero`: '--lock-wait 0' = do not wait); None when not given and no default."""
    raw = option_text(config, dest) or default
    if not raw:
        return None
    try:
        seconds = parse_seconds(raw, where=where(dest))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not (seconds >= 0 if allow_zero else seconds > 0):
        raise pytest.UsageError(f"{where(dest)}: {raw!r} must be {'>= 0' if allow_zero else '> 0'}")
    return seconds


def path(config: pytest.Config, dest: str, *, must_exist: bool = False) -> Path | None:
    """A path option, relative to the directory pytest was started in; None when not given."""
    raw = option_text(config, dest)
    if not raw:
        return None
    found = Path(raw).expanduser()
    found = found if found.is_absolute() else config.invocation_params.dir / found
    if must_exist and not found.exists():
        raise pytest.UsageError(f"{where(dest)}: {found} does not exist")
    return found
