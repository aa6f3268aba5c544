"""Probe: which architecture builds of sgl_kernel's common_ops the server's venv has. Prints one JSON object.

Runs on the host under test with the server's python and environment; stdlib only; never imports
pytest_dflash, and does NOT import sgl_kernel (its import loads CUDA code; the import itself is the
import-chain probe's job). sglang-kernel 0.4.x ships sm90/ and sm100/ builds of common_ops and
loads sm90 on compute capability 9.0, sm100 on anything else (sgl_kernel/load_utils.py).

    {"probe": "sgl_kernel_builds", "found": true, "package_dir": "/venv/.../sgl_kernel",
     "version": "0.4.5" | null, "builds": {"sm90": ["common_ops.abi3.so"], "sm100": [...]},
     "top_level": ["common_ops.abi3.so"], "other_libraries": ["flash_ops.abi3.so", ...]}
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os


def main() -> None:
    out: dict = {"probe": "sgl_kernel_builds", "found": False, "package_dir": None, "version": None,
                 "builds": {}, "top_level": [], "other_libraries": []}
    spec = importlib.util.find_spec("sgl_kernel")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if locations:
        package_dir = locations[0]
        out.update(found=True, package_dir=package_dir)
        for dist_name in ("sglang-kernel", "sgl-kernel"):
            try:
                out["version"] = md.version(dist_name)
                break
            except md.PackageNotFoundError:
                continue
        for entry in sorted(os.listdir(package_dir)):
            path = os.path.join(package_dir, entry)
            if os.path.isdir(path) and entry.startswith("sm"):
                out["builds"][entry] = sorted(f for f in os.listdir(path) if f.startswith("common_ops."))
            elif entry.startswith("common_ops.") and ".so" in entry:
                out["top_level"].append(entry)
            elif ".so" in entry:
                out["other_libraries"].append(entry)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
