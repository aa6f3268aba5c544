"""How long after a service dies does pytest-dflash know it, with the log tail in hand?

For each crash fault of the refserver, start it as a provisioned process service, run the real readiness
watcher, and time the gap between the process's death (seen by an independent 5 ms poller of /proc) and the
moment the watcher raised ServiceCrashed carrying the log tail. The target (issue 3): <= 2 s.

    .venv/bin/python benchmarks/crash_to_verdict.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from pytest_dflash.client.inference import InferenceClient
from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.errors import ServiceCrashed
from pytest_dflash.services.process import ProcessService
from pytest_dflash.services.readiness import ReadinessWatcher

FAULTS = {
    "missing-soundfile": "import-time crash, exit 1 (seed 000)",
    "xgrammar-structural-tag": "import-time crash, exit 1 (seed 000/002)",
    "scheduler-crash": "scheduler dies during start-up, SIGKILL (137)",
    "flashinfer-sm120": "first sampled request kills it ~3 s later, SIGKILL (seed 004)",
    "oom-kill=1": "SIGKILL right after answering the first generation (OOM killer)",
}


def died_at(pid: int, stop: threading.Event, out: list[float]) -> None:
    """Poll /proc every 5 ms; record when the process is gone or a zombie."""
    while not stop.is_set():
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        if state in ("Z", "X", "gone"):
            out.append(time.monotonic())
            return
        time.sleep(0.005)


def one(fault: str, log_dir: Path) -> tuple[float, int]:
    spec = ServiceSpec(
        name="svc", kind="process", url="http://127.0.0.1:{port}", algorithm="DFLASH",
        command=("{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
                 "--speculative-algorithm", "DFLASH", "--inject", fault),
    )
    service = ProcessService(spec, host="bench", run_id="bench", python=sys.executable, log_dir=log_dir)
    service.start()
    assert service._proc is not None
    stop, death = threading.Event(), []
    poller = threading.Thread(target=died_at, args=(service._proc.pid, stop, death), daemon=True)
    poller.start()
    client = InferenceClient(service.url, service="svc")
    watcher = ReadinessWatcher(service, client, native=True, budget_s=60, sampled_budget_s=60)
    try:
        watcher.wait()
        raise SystemExit(f"{fault}: readiness passed, the fault did not fire")
    except ServiceCrashed as crash:
        known = time.monotonic()
        if "Traceback" not in crash.log_tail and not fault.startswith("oom-kill"):
            raise SystemExit(f"{fault}: the log tail has no traceback:\n{crash.log_tail[-500:]}") from None
    finally:
        stop.set()
        client.close()
        service.stop()
    poller.join(1)
    if not death:
        raise SystemExit(f"{fault}: the poller never saw the death")
    return known - death[0], service.state().death.exit_status or 0  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("| fault | what | exit | crash → verdict with log tail, median (max) |")
        print("|---|---|---|---|")
        for fault, what in FAULTS.items():
            gaps, status = [], 0
            for _ in range(args.repeat):
                gap, status = one(fault, Path(tmp))
                gaps.append(gap)
            print(f"| `{fault}` | {what} | {status} | {statistics.median(gaps) * 1000:.0f} ms "
                  f"({max(gaps) * 1000:.0f} ms) |", flush=True)


if __name__ == "__main__":
    main()
