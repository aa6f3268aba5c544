"""Command line: SGLang's flag names, argparse errors (exit 2), the --inject syntax."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_dflash.refserver.faults import FAULTS, parse_inject
from pytest_dflash.refserver.server_args import build_parser, prepare_server_args

MODULE = [sys.executable, "-m", "pytest_dflash.refserver"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODULE, *args], capture_output=True, text=True, timeout=60)


def test_unknown_flag_is_an_argparse_error() -> None:
    done = run("--no-such-flag")
    assert done.returncode == 2 and "unrecognized arguments: --no-such-flag" in done.stderr


def test_unknown_fault_is_an_argparse_error() -> None:
    done = run("--inject", "gpu-on-fire")
    assert done.returncode == 2 and "unknown fault 'gpu-on-fire'" in done.stderr


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("hang", {"hang": 1.0}),
        ("hang=3,bad-json", {"hang": 3.0, "bad-json": 0.0}),
        ("flashinfer-sm120", {"flashinfer-sm120": 3.0}),
        ("slow-decode=2.5", {"slow-decode": 2.5}),
    ],
)
def test_inject_syntax(raw: str, parsed: dict[str, float]) -> None:
    assert parse_inject(raw) == parsed


@pytest.mark.parametrize("raw", ["slow-load", "oom-kill=0", "oom-kill=1.5", "bad-json=1", "hang=-1", "cold-jit=soon"])
def test_inject_rejects_bad_values(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_inject(raw)


def test_inject_is_repeatable_and_logged_in_server_args() -> None:
    args = prepare_server_args(["--inject", "hang=2", "--inject", "bad-json,slow-decode=3"])
    assert args.inject == {"hang": 2.0, "bad-json": 0.0, "slow-decode": 3.0}
    assert "inject='hang=2,bad-json,slow-decode=3'" in args.log_line()


def test_speculative_defaults_and_alias() -> None:
    args = prepare_server_args(["--speculative-algorithm", "dflash", "--speculative-dflash-block-size", "4"])
    assert (args.speculative_algorithm, args.block_size, args.max_running_requests) == ("DFLASH", 4, 48)
    args = prepare_server_args(["--speculative-algorithm", "DDTREE"])
    assert (args.block_size, args.ddtree_budget) == (8, 32)
    plain = prepare_server_args([])
    assert (plain.speculative_algorithm, plain.port, plain.host, plain.effective_context_length) == ("NONE", 30000, "127.0.0.1", 2048)


def test_unit_file_flags_are_accepted_and_logged() -> None:
    args = prepare_server_args(
        ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
         "--mem-fraction-static", "0.8", "--page-size", "1", "--tp-size", "1", "--disable-cuda-graph",
         "--cuda-graph-max-bs", "8", "--max-running-requests", "4", "--trust-remote-code", "--dtype", "bfloat16",
         "--speculative-draft-model-path", "/models/draft", "--random-seed", "5", "--model-seed", "2"]
    )  # fmt: skip
    line = args.log_line()
    for text in ("attention_backend='triton'", "sampling_backend='pytorch'", "mem_fraction_static=0.8",
                 "disable_cuda_graph=True", "max_running_requests=4", "speculative_draft_model_path='/models/draft'"):  # fmt: skip
        assert text in line


def test_ddtree_needs_page_size_1() -> None:
    with pytest.raises(ValueError, match="requires --page-size 1"):
        prepare_server_args(["--speculative-algorithm", "DDTREE", "--page-size", "16"])


def test_help_lists_every_flag_and_fault() -> None:
    text = build_parser().format_help()
    for flag in ("--host", "--port", "--model-path", "--speculative-algorithm", "--speculative-num-draft-tokens",
                 "--speculative-dflash-block-size", "--speculative-ddtree-budget", "--context-length", "--enable-metrics",
                 "--api-key", "--inject", "--mimic-version"):  # fmt: skip
        assert flag in text
    docs = (Path(__file__).parents[2] / "docs" / "refserver.md").read_text()
    text = re.sub(r"-\n\s+", "-", text)  # argparse wraps the help at hyphens too
    for fault in FAULTS:  # each in --help and in the docs' table of faults
        assert fault in text and f"| `{fault}` |" in docs, fault
