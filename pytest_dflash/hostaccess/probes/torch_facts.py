"""Probe: what torch in the server's venv was built for and what it sees. Prints one JSON object.

Runs on the host under test with the server's python; stdlib + torch; never imports pytest_dflash.

    {"probe": "torch_facts", "python": {"executable": ..., "version": "3.12.3"},
     "import_error": null | "<traceback tail>",
     "torch": {"version": "2.11.0+cu130", "cuda": "13.0" | null, "hip": null, "arch_list": ["sm_90", ...],
               "cuda_available": true, "device_count": 1, "driver_api_version": 13000 | null,
               "cudnn": 91900 | null, "nccl": "2.27.7" | null,
               "devices": [{"index": 0, "name": "NVIDIA H200", "capability": [9, 0], "total_memory": 150...}],
               "cuda_error": null | "<exception text>", "warnings": ["<CUDA initialization warning>", ...]}}

Without a GPU (or with a CPU build) `devices` is empty and `cuda_available` false; the warnings
torch emits while initialising CUDA (e.g. "The NVIDIA driver on your system is too old") are kept
verbatim because they are the evidence.
"""

from __future__ import annotations

import json
import platform
import sys
import traceback
import warnings


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def main() -> None:
    out: dict = {"probe": "torch_facts",
                 "python": {"executable": sys.executable, "version": platform.python_version()},
                 "import_error": None, "torch": None}
    try:
        import torch
    except BaseException:
        out["import_error"] = tail(traceback.format_exc())
        print(json.dumps(out))
        return
    facts: dict = {"version": torch.__version__, "cuda": torch.version.cuda,
                   "hip": getattr(torch.version, "hip", None), "arch_list": [], "cuda_available": False,
                   "device_count": 0, "driver_api_version": None, "cudnn": None, "nccl": None, "devices": [],
                   "cuda_error": None, "warnings": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            facts["arch_list"] = list(torch.cuda.get_arch_list())
            facts["cuda_available"] = bool(torch.cuda.is_available())
            facts["device_count"] = int(torch.cuda.device_count()) if facts["cuda_available"] else 0
            for index in range(facts["device_count"]):
                props = torch.cuda.get_device_properties(index)
                facts["devices"].append({"index": index, "name": props.name,
                                         "capability": [props.major, props.minor],
                                         "total_memory": int(props.total_memory)})
            getter = getattr(torch._C, "_cuda_getDriverVersion", None)
            if facts["cuda_available"] and getter is not None:
                facts["driver_api_version"] = int(getter())
            if torch.backends.cudnn.is_available():
                facts["cudnn"] = torch.backends.cudnn.version()
            if facts["cuda_available"]:
                nccl = torch.cuda.nccl.version()
                facts["nccl"] = ".".join(str(part) for part in nccl) if isinstance(nccl, tuple) else str(nccl)
        except BaseException as exc:
            facts["cuda_error"] = f"{type(exc).__name__}: {exc}"
    facts["warnings"] = [str(w.message)[:2000] for w in caught if "cuda" in str(w.message).lower()
                         or "driver" in str(w.message).lower()]
    out["torch"] = facts
    print(json.dumps(out))


if __name__ == "__main__":
    main()
