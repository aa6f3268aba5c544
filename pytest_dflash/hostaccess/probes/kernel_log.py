"""Probe: kernel-log lines about GPU faults and the OOM killer since boot. Prints one JSON object.

Runs on the host under test; stdlib only; never imports pytest_dflash. Reads `journalctl -k -b`
and falls back to `dmesg` when the journal has no kernel messages (containers, hosts without a
persistent journal). Only lines matching the controller's pattern come back:

    {"probe": "kernel_log", "source": "journalctl -k -b" | "dmesg" | null, "readable": true,
     "total_lines": 1234, "matches": ["[  12.3] NVRM: Xid (PCI:0000:01:00): 79, ...", ...],
     "truncated": false, "attempts": [{"argv": [...], "rc": 0, "lines": 1234, "stderr": ""}],
     "boot_time": "2026-11-30T02:20:01" | null}

argv[1]: JSON {"pattern": "<python regex>", "max_matches": 200, "timeout_s": 20}.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

DEFAULT_PATTERN = r"NVRM: Xid|fallen off the bus|Out of memory|oom-kill|oom_reaper|Killed process"
EMPTY_JOURNAL = ("No journal files were found", "-- No entries --")


def read(argv: list[str], timeout_s: float) -> tuple[dict, list[str]]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"argv": argv, "rc": None, "lines": 0, "stderr": f"{type(exc).__name__}: {exc}"}, []
    lines = [line for line in done.stdout.splitlines() if line.strip() and line.strip() not in EMPTY_JOURNAL]
    return {"argv": argv, "rc": done.returncode, "lines": len(lines),
            "stderr": done.stderr.strip()[-2000:]}, lines


def boot_time() -> str | None:
    try:
        with open("/proc/stat") as handle:
            for line in handle:
                if line.startswith("btime "):
                    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(line.split()[1])))
    except OSError:
        return None
    return None


def main() -> None:
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    pattern = re.compile(params.get("pattern") or DEFAULT_PATTERN)
    max_matches = int(params.get("max_matches", 200))
    timeout_s = float(params.get("timeout_s", 20))
    out: dict = {"probe": "kernel_log", "source": None, "readable": False, "total_lines": 0, "matches": [],
                 "truncated": False, "attempts": [], "boot_time": boot_time()}
    for argv in (["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic"], ["dmesg"]):
        attempt, lines = read(argv, timeout_s)
        out["attempts"].append(attempt)
        if attempt["rc"] == 0 and lines:
            matches = [line for line in lines if pattern.search(line)]
            out.update(source=" ".join(argv[:3]) if argv[0] == "journalctl" else "dmesg", readable=True,
                       total_lines=len(lines), matches=matches[-max_matches:],
                       truncated=len(matches) > max_matches)
            break
    print(json.dumps(out))


if __name__ == "__main__":
    main()
