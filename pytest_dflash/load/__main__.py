"""The load generator's command line: ``python -m pytest_dflash.load URL …``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_dflash.load.loop import run_coro, run_load_async
from pytest_dflash.load.procs import run_load_procs
from pytest_dflash.load.spec import ENDPOINT_PATHS, LoadSpec
from pytest_dflash.load.workload import DatasetError, dataset_path, load_dataset


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_dflash.load URL …``: one run, a summary on stdout, JSON to ``--out``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m pytest_dflash.load", description=main.__doc__)
    ap.add_argument("base_url")
    ap.add_argument("--endpoint", choices=sorted(ENDPOINT_PATHS), default="chat")
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--request-rate", type=float, default=None)
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--dataset", default=None, metavar="PATH",
                    help="send these prompts (cycled, in a seeded order) instead of synthetic words: JSONL "
                         "of {\"prompt\"} / {\"category\", \"prompt\"} per line, or ShareGPT's JSON list of "
                         "{\"conversations\"} (the first human turn); 'builtin' = the shipped prompt set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--server-accept-length", action="store_true")
    ap.add_argument("--client-procs", type=int, default=1,
                    help="spread the run over N client processes, each its own event loop (default 1)")
    ap.add_argument("--stock-httpx", action="store_true", help="httpx's own transport (httpcore + h11)")
    ap.add_argument("--out", default=None, help="write LoadResult JSON here")
    ap.add_argument("--no-records", action="store_true", help="leave per-request records out of --out")
    a = ap.parse_args(argv)
    if a.dataset is not None:
        try:
            load_dataset(a.dataset)
        except DatasetError as exc:
            print(f"{ap.prog}: error: --dataset: {exc}", file=sys.stderr)
            return 2
        a.dataset = str(dataset_path(a.dataset).resolve())
    spec = LoadSpec(endpoint=a.endpoint, model=a.model, concurrency=a.concurrency,
                    request_rate=a.request_rate, num_requests=a.num_requests, duration_s=a.duration,
                    warmup_requests=a.warmup, prompt_len=a.prompt_len, output_len=a.output_len,
                    dataset=a.dataset, seed=a.seed, temperature=a.temperature,
                    request_timeout_s=a.request_timeout, server_accept_length=a.server_accept_length,
                    client_procs=a.client_procs)
    if spec.client_procs > 1:
        result = run_load_procs(a.base_url, spec, stamped=not a.stock_httpx)
    else:
        result = run_coro(run_load_async(a.base_url, spec, stamped=not a.stock_httpx))
    print(result.summary())
    if a.out:
        Path(a.out).write_text(result.to_json(records=not a.no_records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
