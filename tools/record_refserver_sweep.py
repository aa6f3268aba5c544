"""Records tests/data/refserver-sweep/: a plain and a DFLASH refserver under one GPU cost model with a batch
effect (--gpu-step-ms 4 --gpu-token-us 600), one load run per service per level (1, 4, 8), interleaved, in the
per-service JSON the load generator writes (`python -m pytest_dflash.load URL --out FILE`).

    .venv/bin/python tools/record_refserver_sweep.py
"""

from __future__ import annotations

from pathlib import Path

from pytest_dflash.load.run import run_load
from pytest_dflash.load.spec import LoadSpec
from pytest_dflash.refserver.launch import RefServerProcess

COST = ("--gpu-step-ms", "4", "--gpu-token-us", "600")
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "refserver-sweep"


def main() -> None:
    with RefServerProcess(*COST) as none, RefServerProcess(
            *COST, "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8") as dflash:
        for index, level in enumerate((1, 4, 8)):
            order = [("none", none), ("dflash", dflash)]
            for name, server in order if index % 2 == 0 else order[::-1]:
                # the client shares two cores with the servers: a lag of 200 ms is still a valid run here
                spec = LoadSpec(endpoint="generate", concurrency=level, num_requests=max(20 * level, 30),
                                warmup_requests=level, prompt_len=8, output_len=16, max_loop_lag_ms=200,
                                max_client_cpu=1.0)
                result = run_load(server.url, spec)
                (OUT / f"{name}-c{level}.json").write_text(result.to_json())
                print(name, level, round(result.metrics["output_throughput"], 1), result.client_saturated)


if __name__ == "__main__":
    main()
