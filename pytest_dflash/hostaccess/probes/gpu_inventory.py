"""Probe: the GPUs of this host as nvidia-smi reports them. Prints one JSON object.

Runs on the host under test with the server's python; stdlib only; never imports pytest_dflash.
The raw texts go back to the controller, which parses them (pytest_dflash.layers.gpu.smi):

    {"probe": "gpu_inventory", "nvidia_smi": "/usr/bin/nvidia-smi" | null,
     "query":  {"argv": [...], "rc": 0, "stdout": "<csv with header>", "stderr": "", "seconds": 0.1},
     "xml":    {... the same for `nvidia-smi -q -x` ...},
     "apps":   {... the same for --query-compute-apps ...},
     "error": null | "why nothing could be asked"}

argv[1] (optional): JSON {"timeout_s": 20}.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

QUERY_FIELDS = (
    "index,uuid,name,pci.bus_id,compute_cap,driver_version,memory.total,memory.used,"
    "persistence_mode,ecc.mode.current"
)
APPS_FIELDS = "gpu_uuid,pid,process_name,used_memory"
XML_LIMIT = 4_000_000  # characters; one GPU's -q -x is ~25 kB


def run(argv: list[str], timeout_s: float, limit: int = 200_000) -> dict:
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"argv": argv, "rc": None, "stdout": "", "stderr": f"timed out after {timeout_s:g}s",
                "seconds": round(time.monotonic() - started, 3)}
    except OSError as exc:
        return {"argv": argv, "rc": None, "stdout": "", "stderr": f"{type(exc).__name__}: {exc}",
                "seconds": round(time.monotonic() - started, 3)}
    return {"argv": argv, "rc": done.returncode, "stdout": done.stdout[:limit], "stderr": done.stderr[-4000:],
            "seconds": round(time.monotonic() - started, 3)}


def main() -> None:
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    timeout_s = float(params.get("timeout_s", 20))
    out: dict = {"probe": "gpu_inventory", "nvidia_smi": shutil.which("nvidia-smi"), "query": None,
                 "xml": None, "apps": None, "error": None}
    smi = out["nvidia_smi"]
    if smi is None:
        out["error"] = "nvidia-smi not found on PATH"
    else:
        out["query"] = run([smi, f"--query-gpu={QUERY_FIELDS}", "--format=csv"], timeout_s)
        out["xml"] = run([smi, "-q", "-x"], timeout_s, limit=XML_LIMIT)
        out["apps"] = run([smi, f"--query-compute-apps={APPS_FIELDS}", "--format=csv"], timeout_s)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
