"""Speed of the embedded reference host: start-up, a 64-token request, accept length, tokens/s.

    .venv/bin/python benchmarks/refserver_speed.py            # print the table
    .venv/bin/python benchmarks/refserver_speed.py --write    # also replace "## refserver" in README.md

Start-up is measured from process launch to the first 200 from /health_generate (a real generation,
after the warm-up request). Accept length and tokens/s run in-process on the built-in prompts
(greedy, 128 new tokens each, EOS ignored) so HTTP overhead does not hide the algorithms' cost.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from pathlib import Path

import httpx
import torch

from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.refserver.model import BUILTIN_PROMPTS, ByteTokenizer, ModelConfig, TinyLM
from pytest_dflash.refserver.spec import Engine, SamplingParams

README = Path(__file__).with_name("README.md")


def startup_seconds(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        server = RefServerProcess(wait_ready=False)
        t0 = time.monotonic()
        with server:
            server.wait_ready(60)
            times.append(time.monotonic() - t0)
    return times


def request_seconds(runs: int) -> list[float]:
    """Client-side latency of one greedy 64-token /generate on a NONE server (after warm-up)."""
    params = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
    body = {"text": "The quick brown fox", "sampling_params": params}
    with RefServerProcess() as server, httpx.Client(base_url=server.url, timeout=30) as client:
        client.post("/generate", json=body)
        times = []
        for _ in range(runs):
            t0 = time.monotonic()
            assert client.post("/generate", json=body).json()["meta_info"]["completion_tokens"] == 64
            times.append(time.monotonic() - t0)
    return times


def algorithms(block_size: int, budget: int) -> dict[str, tuple[float, float]]:
    """tokens/s and mean accept length per algorithm, in-process, greedy, on the built-in prompts."""
    torch.set_num_threads(1)
    model, tok = TinyLM(ModelConfig(), seed=0), ByteTokenizer()
    out = {}
    for algo in ("NONE", "DFLASH", "DDTREE"):
        engine = Engine(model, algo, block_size=block_size, ddtree_budget=budget)
        tokens = verify = accepted = 0
        t0 = time.perf_counter()
        for prompt in BUILTIN_PROMPTS:
            params = SamplingParams(temperature=1.0, top_k=1, max_new_tokens=128, ignore_eos=True)
            seq, first = engine.start(tok.encode(prompt), params, seed=0)
            seq.output += first.tokens
            while len(seq.output) < 128:
                seq.output += engine.step(seq).tokens
            tokens += 128
            verify += seq.stats.verify_ct
            accepted += seq.stats.accepted_drafts
        elapsed = time.perf_counter() - t0
        out[algo] = (tokens / elapsed, (accepted + verify) / verify if verify else 1.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", action="store_true",
                        help="replace the '## refserver' section of README.md")
    args = parser.parse_args()
    ready = startup_seconds(args.runs)
    latency = request_seconds(max(args.runs, 5))
    algos = algorithms(block_size=8, budget=32)
    load = os.getloadavg()[0]
    lines = [
        "## refserver",
        "",
        "`benchmarks/refserver_speed.py` (the embedded reference host, `python -m pytest_dflash.refserver`),",
        f"on this 2-core machine shared with other jobs (1-min load average {load:.1f} during the run),",
        f"torch {torch.__version__}, one torch thread. Medians of {args.runs}+ runs.",
        "",
        "| measure | target | measured |",
        "|---|---|---|",
        f"| launch → first 200 from `/health_generate` | < 5 s | {statistics.median(ready):.2f} s "
        f"(max {max(ready):.2f} s) |",
        f"| greedy `/generate`, 64 new tokens, NONE (client side) | < 1 s | "
        f"{statistics.median(latency) * 1000:.0f} ms (max {max(latency) * 1000:.0f} ms) |",
        "",
        "Greedy decoding of the 8 built-in prompts, 128 new tokens each, in-process (block size 8, DDTREE",
        "budget 32). Accept length counts the bonus token (SGLang's `avg_spec_accept_length`).",
        "",
        "| algorithm | tokens/s | mean accept length |",
        "|---|---|---|",
        *(f"| {a} | {tps:.0f} | {'-' if a == 'NONE' else f'{acc:.2f}'} |" for a, (tps, acc) in algos.items()),
        "",
        "On a CPU the tiny target costs about as much per pass as the drafter, so speculation is slower",
        "than NONE here; the numbers are for spotting regressions, not a claim about GPUs.",
        "",
    ]
    table = "\n".join(lines)
    print(table)
    if args.write:
        text = README.read_text() if README.exists() else "# Benchmarks\n\n"
        pattern = re.compile(r"^## refserver\n.*?(?=^## |\Z)", re.S | re.M)
        text = pattern.sub(table + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + table
        README.write_text(text)


if __name__ == "__main__":
    main()
