"""A/B: our load generator's transport vs an aiohttp client written the way sglang's bench_serving writes it.

Same synthetic server (pytest_dflash/refserver/synthetic.py), same load (the same prompts: request i is
built by our workload for both), each client in a fresh process of its own, repetitions interleaved
(ours, aiohttp, ours, aiohttp …):

* ``accuracy``: server TTFT 50 ms, ITL 10 ms, 128 tokens, concurrency 8: TTFT p50 / p99 and mean ITL as
  each client measured them, minus what the server measured for the same requests (``/stats``, warm-up
  excluded with ``/stats/reset?skip=W``);
* ``capacity``: server TTFT = ITL = 0, 256 tokens in one write, concurrency 32, a fixed duration: output
  tokens per client CPU-second (``time.process_time()`` of the client process around its run: warm-up and
  measured phase, not the interpreter's start-up and imports; the same for both clients).

The aiohttp client follows ``bench_serving.async_request_openai_chat_completions``: one
``aiohttp.ClientSession`` with a ``TCPConnector(limit=concurrency)``, ``async for line in
response.content``, strip, drop ``data: ``, ``json.loads`` every event, a token is a chunk whose
``delta.content`` is non-empty, ``time.perf_counter()`` at that point.

    .venv/bin/python benchmarks/aiohttp_ab.py --reps 5            # aiohttp: pip install -e .[dev]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = "synth-model"
EXPERIMENTS: dict[str, dict[str, Any]] = {
    "accuracy": {"server": ["--tokens", "128", "--ttft-ms", "50", "--itl-ms", "10"], "concurrency": 8,
                 "requests": 48, "duration": None, "warmup": 8, "tokens": 128},
    "capacity": {"server": ["--tokens", "256", "--ttft-ms", "0", "--itl-ms", "0"], "concurrency": 32,
                 "requests": None, "duration": 8.0, "warmup": 32, "tokens": 256},
}


# -- the two clients (run in a child process: `aiohttp_ab.py client …`) -------------------------------------


def _spec(a: argparse.Namespace) -> Any:
    from pytest_dflash.load import LoadSpec

    return LoadSpec(endpoint="chat", model=MODEL, concurrency=a.concurrency, num_requests=a.requests,
                    duration_s=a.duration, warmup_requests=a.warmup, prompt_len=128, output_len=a.tokens)


async def _ours(url: str, a: argparse.Namespace) -> dict[str, Any]:
    from pytest_dflash.load import run_load_async

    r = await run_load_async(url, _spec(a), progress=False)
    measured = r.successful
    return {"ttft_ms": [x.ttft_ms for x in measured], "itl_ms": [g for x in measured for g in x.itl_ms],
            "tokens": sum(x.output_tokens or 0 for x in r.records if x.ok), "failed": r.metrics["failed"],
            "measured_tokens": r.metrics["total_output_tokens"], "saturated": r.client_saturated}


async def _aiohttp(url: str, a: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    from pytest_dflash.load.workload import Workload

    workload = Workload(_spec(a))
    ttfts: list[float] = []
    itls: list[float] = []
    totals = {"tokens": 0, "failed": 0, "measured_tokens": 0}
    counter = 0
    connector = aiohttp.TCPConnector(limit=a.concurrency)
    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)  # bench_serving's AIOHTTP_TIMEOUT
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session:

        async def one(warmup: bool) -> None:
            nonlocal counter
            item = workload.item(counter)
            counter += 1
            payload = {"model": MODEL, "messages": [{"role": "user", "content": item.prompt}],
                       "max_tokens": item.max_tokens, "temperature": 0.0, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True}
            ttft, itl, tokens = 0.0, [], 0
            st = time.perf_counter()
            most_recent = st
            async with session.post(url + "/v1/chat/completions", json=payload,
                                    headers={"Content-Type": "application/json"}) as response:
                if response.status != 200:
                    totals["failed"] += 1
                    return
                async for chunk_bytes in response.content:
                    chunk_bytes = chunk_bytes.strip()
                    if not chunk_bytes:
                        continue
                    chunk = chunk_bytes.decode("utf-8").removeprefix("data: ")
                    if chunk == "[DONE]":
                        continue
                    data = json.loads(chunk)
                    if data.get("choices") and data["choices"][0]["delta"].get("content"):
                        timestamp = time.perf_counter()
                        if ttft == 0.0:
                            ttft = timestamp - st
                        else:
                            itl.append(timestamp - most_recent)
                        most_recent = timestamp
                    if data.get("usage"):
                        tokens = data["usage"]["completion_tokens"]
            totals["tokens"] += tokens
            if not warmup:
                totals["measured_tokens"] += tokens
                ttfts.append(ttft * 1e3)
                itls.extend(g * 1e3 for g in itl)

        async def warm_worker(left: list[int]) -> None:
            while left[0] > 0:
                left[0] -= 1
                await one(True)

        left = [a.warmup]
        await asyncio.gather(*(warm_worker(left) for _ in range(min(a.concurrency, a.warmup))))
        stop_at = time.perf_counter() + a.duration if a.duration else None
        budget = [a.requests if a.requests else 1 << 60]

        async def worker() -> None:
            while budget[0] > 0 and (stop_at is None or time.perf_counter() < stop_at):
                budget[0] -= 1
                await one(False)

        await asyncio.gather(*(worker() for _ in range(a.concurrency)))
    return {"ttft_ms": ttfts, "itl_ms": itls, **totals, "saturated": None}


def client_main(a: argparse.Namespace) -> int:
    run = _ours if a.kind == "ours" else _aiohttp
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out = asyncio.run(run(a.url, a))
    out["cpu_s"] = time.process_time() - cpu0
    out["wall_s"] = time.perf_counter() - wall0
    Path(a.out).write_text(json.dumps(out))
    return 0


# -- the driver -------------------------------------------------------------------------------------------


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=10):
        pass


def _pct(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()


def one_run(url: str, kind: str, exp: dict[str, Any], workdir: Path, rep: int) -> dict[str, Any]:
    _post(f"{url}/stats/reset?skip={exp['warmup']}")
    out = workdir / f"{kind}-{rep}.json"
    cmd = [sys.executable, __file__, "client", "--kind", kind, "--url", url, "--concurrency",
           str(exp["concurrency"]), "--warmup", str(exp["warmup"]), "--tokens", str(exp["tokens"]), "--out",
           str(out)]
    cmd += ["--requests", str(exp["requests"])] if exp["requests"] else ["--duration", str(exp["duration"])]
    load = uptime()
    subprocess.run(cmd, check=True, timeout=300, cwd=REPO)
    got = json.loads(out.read_text())
    truth = _get(f"{url}/stats")
    return {
        "kind": kind, "rep": rep, "uptime": load, "failed": got["failed"],
        "tok_per_cpu_s": got["tokens"] / got["cpu_s"] if got["cpu_s"] else float("nan"),
        "client_cores": got["cpu_s"] / got["wall_s"], "tok_s": got["tokens"] / got["wall_s"],
        "ttft_p50_err_ms": _pct(got["ttft_ms"], 50) - truth["ttft_ms"]["p50"],
        "ttft_p99_err_ms": _pct(got["ttft_ms"], 99) - truth["ttft_ms"]["p99"],
        "itl_mean_err_ms": ((statistics.fmean(got["itl_ms"]) - truth["itl_ms"]["mean"]) if got["itl_ms"]
                            else None),
        "server_ttft_p50_ms": truth["ttft_ms"]["p50"], "saturated": got["saturated"],
    }


def _mmm(values: list[float]) -> str:
    vals = [v for v in values if v is not None and v == v]  # None / NaN: not measurable in this experiment
    if not vals:
        return "n/a"
    return f"{min(vals):,.3f} / **{statistics.median(vals):,.3f}** / {max(vals):,.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("client")
    c.add_argument("--kind", choices=("ours", "aiohttp"), required=True)
    c.add_argument("--url", required=True)
    c.add_argument("--concurrency", type=int, required=True)
    c.add_argument("--requests", type=int, default=None)
    c.add_argument("--duration", type=float, default=None)
    c.add_argument("--warmup", type=int, default=0)
    c.add_argument("--tokens", type=int, required=True)
    c.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--experiments", default="accuracy,capacity")
    ap.add_argument("--workdir", default=str(REPO / "benchmarks" / ".work" / "aiohttp_ab"))
    a = ap.parse_args()
    if a.cmd == "client":
        return client_main(a)
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"nproc {os.cpu_count()}; {uptime()}")
    for name in a.experiments.split(","):
        exp = EXPERIMENTS[name]
        srv = subprocess.Popen([sys.executable, "-m", "pytest_dflash.refserver.synthetic", "--port", "0",
                                *exp["server"]], stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            assert srv.stdout is not None
            url = f"http://127.0.0.1:{int(srv.stdout.readline().split()[1])}"
            rows = [one_run(url, kind, exp, workdir, rep) for rep in range(a.reps)
                    for kind in ("ours", "aiohttp")]
        finally:
            srv.terminate()
            srv.wait(timeout=10)
        (workdir / f"{name}.json").write_text(json.dumps(rows, indent=1))
        print(f"\n{name}: concurrency {exp['concurrency']}, server {' '.join(exp['server'])}, {a.reps} reps "
              "(min / median / max)")
        print("| client | failed | output tok per client CPU-s | client cores | tok/s | TTFT p50 err ms "
              "| TTFT p99 err ms | ITL mean err ms |")
        print("|---|---|---|---|---|---|---|---|")
        for kind in ("ours", "aiohttp"):
            mine = [r for r in rows if r["kind"] == kind]
            print(f"| {kind} | {sum(r['failed'] for r in mine)} | {_mmm([r['tok_per_cpu_s'] for r in mine])} "
                  f"| {_mmm([r['client_cores'] for r in mine])} | {_mmm([r['tok_s'] for r in mine])} | "
                  f"{_mmm([r['ttft_p50_err_ms'] for r in mine])} | "
                  f"{_mmm([r['ttft_p99_err_ms'] for r in mine])} | "
                  f"{_mmm([r['itl_mean_err_ms'] for r in mine])} |")
        loads = sorted({r["uptime"].split("load average:")[-1].strip() for r in rows})
        print(f"load averages before the runs: {loads[0]} … {loads[-1]}")
    print(f"\nafter: {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
