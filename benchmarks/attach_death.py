"""Attach mode fails fast: how long from a server's death (or silence) to a failing verdict?

Each run starts a refserver, runs `pytest --attach URL suites/smoke` against it in a fresh pytest process
and times, with an independent 5 ms poller:

* `flashinfer-sm120`: the first sampled request kills the server ~3 s later (seed 004). Measured: from the
  server process's death (gone or a zombie in /proc) to the verdict JSON on disk (target <= 5 s), and to the
  pytest process's exit.
* `hang=1` with `--request-timeout 10s`: the first generation is admitted and never answered, while the
  server keeps answering everything else. Measured: from pytest's start to the verdict JSON (target <= 20 s).

    .venv/bin/python benchmarks/attach_death.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pytest_dflash.refserver.launch import RefServerProcess

ROOT = Path(__file__).resolve().parents[1]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def failed(verdict: Path) -> bool:
    """The verdict JSON says fail (a provisional one may be on disk earlier)."""
    try:
        return json.loads(verdict.read_text()).get("verdict") == "fail"
    except (OSError, ValueError):
        return False


def poll(predicate: object, stop: threading.Event, out: dict[str, float], key: str) -> None:
    """Record in out[key] the first moment predicate() is true (5 ms resolution)."""
    assert callable(predicate)
    while not stop.is_set():
        if predicate():
            out[key] = time.monotonic()
            return
        time.sleep(0.005)


def one_run(fault: str, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="attach-death-") as tmp, \
            RefServerProcess("--speculative-algorithm", "DFLASH", "--inject", fault) as server:
        reports = Path(tmp) / "reports"
        verdict = reports / f"127.0.0.1_{server.port}.verdict.json"
        times: dict[str, float] = {}
        stop = threading.Event()
        watchers = [threading.Thread(target=poll, args=(lambda: gone(server.pid), stop, times, "died")),
                    threading.Thread(target=poll, args=(lambda: failed(verdict), stop, times, "verdict"))]
        for thread in watchers:
            thread.start()
        times["start"] = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                               str(ROOT / "suites" / "smoke"), "--attach", server.url,
                               f"--dflash-report={reports}", *extra], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
        times["exit"] = time.monotonic()
        time.sleep(0.05)
        stop.set()
        for thread in watchers:
            thread.join()
        outcome = json.loads(verdict.read_text())["verdict"] if verdict.exists() else "none"
        if proc.returncode != 1 or outcome != "fail":
            raise SystemExit(f"{fault}: expected a failing run, got exit {proc.returncode}, verdict "
                             f"{outcome}\n{proc.stdout[-2000:]}")
        return times


def summary(label: str, values: list[float], target: float) -> str:
    ok = "met" if max(values) <= target else "NOT met"
    return (f"{label}: min {min(values):.2f} s, median {statistics.median(values):.2f} s, max "
            f"{max(values):.2f} s (target <= {target:g} s: {ok}; {len(values)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    death_to_verdict, death_to_exit, hang_to_verdict = [], [], []
    for _ in range(args.repeat):
        times = one_run("flashinfer-sm120", [])
        death_to_verdict.append(times["verdict"] - times["died"])
        death_to_exit.append(times["exit"] - times["died"])
        times = one_run("hang=1", ["--request-timeout=10s"])
        hang_to_verdict.append(times["verdict"] - times["start"])
    print(summary("flashinfer-sm120: death -> verdict JSON", death_to_verdict, 5))
    print(summary("flashinfer-sm120: death -> pytest exit", death_to_exit, 5))
    print(summary("hang=1, --request-timeout 10s: pytest start -> verdict JSON", hang_to_verdict, 20))


if __name__ == "__main__":
    main()
