"""Saturated rate of the load generator with --client-procs 1/2/4 against the synthetic server.

Server: TTFT = ITL = 0, 256 tokens in one write (a client-bound load); the CLI
``python -m pytest_dflash.load … --client-procs P`` in a fresh process per run, repetitions interleaved
(1, 2, 4, 1, 2, 4 …). Reported: the run's output tok/s (one merged result), whether it called itself
saturated (and which processes), and the client's CPU (the CLI and its client processes,
``getrusage(RUSAGE_CHILDREN)``) per wall second of the run.

    .venv/bin/python benchmarks/client_procs.py --reps 3 [--procs 1,2,4] [--concurrency 32] [--duration 8]
        [--server-procs K] [--client-cpus 0-3 --server-cpus 4-15]

``--server-procs K`` runs K synthetic server processes on one port (``--reuse-port``: the kernel spreads the
connections), so the server is not what 4 client processes wait on; ``--client-cpus`` / ``--server-cpus`` pin
the load CLI (and its client processes) and the servers to disjoint CPU sets (``taskset -c``): "4 client
processes on a 4-core box" measured on a bigger one, the server's CPU not the client's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--workdir", default=str(REPO / "benchmarks" / ".work" / "client_procs"))
    ap.add_argument("--server-procs", type=int, default=1, help="synthetic server processes sharing the port")
    ap.add_argument("--client-cpus", default="", help="taskset CPU list for the load CLI and its processes")
    ap.add_argument("--server-cpus", default="", help="taskset CPU list for the server processes")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    procs = [int(p) for p in a.procs.split(",")]
    client_pin = ["taskset", "-c", a.client_cpus] if a.client_cpus else []
    server_pin = ["taskset", "-c", a.server_cpus] if a.server_cpus else []
    print(f"nproc {os.cpu_count()}; server procs {a.server_procs}; client cpus {a.client_cpus or 'any'}; "
          f"server cpus {a.server_cpus or 'any'}; {uptime()}")
    servers: list[subprocess.Popen[str]] = []
    rows: list[dict[str, object]] = []
    try:
        port = 0
        for _ in range(a.server_procs):
            srv = subprocess.Popen([*server_pin, sys.executable, "-m", "pytest_dflash.refserver.synthetic",
                                    "--port", str(port), "--tokens", "256", "--ttft-ms", "0",
                                    "--itl-ms", "0", "--reuse-port"],
                                   stdout=subprocess.PIPE, text=True, cwd=REPO)
            servers.append(srv)
            assert srv.stdout is not None
            port = int(srv.stdout.readline().split()[1])  # the first one picks it, the others join it
        url = f"http://127.0.0.1:{port}"
        for rep in range(a.reps):
            for p in procs:
                out = work / f"p{p}-{rep}.json"
                load = uptime()
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run([*client_pin, sys.executable, "-m", "pytest_dflash.load", url, "--model",
                                "synth-model", "--client-procs", str(p), "--concurrency", str(a.concurrency),
                                "--duration", str(a.duration), "--warmup", str(a.concurrency),
                                "--prompt-len", "128", "--output-len", "256", "--out",
                                str(out), "--no-records"],
                               check=True, timeout=300, cwd=REPO, stdout=subprocess.DEVNULL)
                wall = time.perf_counter() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                doc = json.loads(out.read_text())
                rows.append({"procs": p, "rep": rep, "tok_s": doc["output_throughput"], "cpu_s": cpu,
                             "wall_s": wall, "saturated": doc["client_saturated"],
                             "saturated_processes": doc["saturation"]["saturated_processes"],
                             "lag_p99_ms": doc["saturation"]["loop_lag_p99_ms"], "uptime": load})
                print(json.dumps(rows[-1]))
    finally:
        for srv in servers:
            srv.terminate()
        for srv in servers:
            srv.wait(timeout=10)
    (work / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n| --client-procs | output tok/s min / median / max | vs 1 proc (medians) | client CPU-s per "
          "wall-s | saturated runs |")
    print("|---|---|---|---|---|")
    base = statistics.median(float(r["tok_s"]) for r in rows if r["procs"] == procs[0])  # type: ignore[arg-type]
    for p in procs:
        mine = [r for r in rows if r["procs"] == p]
        tok = [float(r["tok_s"]) for r in mine]  # type: ignore[arg-type]
        cores = [float(r["cpu_s"]) / float(r["wall_s"]) for r in mine]  # type: ignore[arg-type]
        sat = sum(1 for r in mine if r["saturated"])
        print(f"| {p} | {min(tok):,.0f} / **{statistics.median(tok):,.0f}** / {max(tok):,.0f} | "
              f"{statistics.median(tok) / base:.2f}x | {statistics.median(cores):.2f} | {sat}/{len(mine)} |")
    print(f"\nafter: {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
