"""Probe: what the service's FlashInfer JIT cache holds (read-only). Prints one JSON object.

Runs on the host under test; stdlib only; never imports pytest_dflash or flashinfer; only lists
and stats files. The cache is `<base>/.cache/flashinfer/<version>/<arch>/cached_ops/<module>/`,
where <base> is FLASHINFER_WORKSPACE_BASE, else the home directory of the service's user.

    {"probe": "jit_cache", "base": "/root",
     "base_source": "HOME" | "FLASHINFER_WORKSPACE_BASE" | "user" | "argument",
     "exists": true,
     "modules": [{"version": "0.6.15.post1", "arch": "90a", "module": "sampling", "library": true,
                  "library_bytes": 123, "library_mtime": 1796009907.1, "objects": 3, "ninja": true}],
     "jit_logs": [{"version": ..., "arch": ..., "bytes": 0, "tail": ""}],
     "tvm_ffi": ["sgl_kernel_jit_qknorm_..__arch_9.0a__tvmffi_0.1.11", ...]}

argv[1]: JSON {"base": null | "/path", "user": null | "sglang"}.
"""

from __future__ import annotations

import json
import os
import pwd
import sys


def listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def main() -> None:
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    base, source = params.get("base"), "argument"
    if not base and os.environ.get("FLASHINFER_WORKSPACE_BASE"):
        base, source = os.environ["FLASHINFER_WORKSPACE_BASE"], "FLASHINFER_WORKSPACE_BASE"
    if not base and params.get("user"):
        try:
            base, source = pwd.getpwnam(params["user"]).pw_dir, "user"
        except KeyError:
            base = None
    if not base:
        base, source = os.path.expanduser("~"), "HOME"
    root = os.path.join(base, ".cache", "flashinfer")
    out: dict = {"probe": "jit_cache", "base": base, "base_source": source, "exists": os.path.isdir(root),
                 "modules": [], "jit_logs": [], "tvm_ffi": listdir(os.path.join(base, ".cache", "tvm-ffi"))}
    for version in listdir(root):
        for arch in listdir(os.path.join(root, version)):
            arch_dir = os.path.join(root, version, arch)
            if not os.path.isdir(arch_dir):
                continue
            log = os.path.join(arch_dir, "flashinfer_jit.log")
            if os.path.isfile(log):
                with open(log, errors="replace") as handle:
                    text = handle.read()[-4000:]
                out["jit_logs"].append({"version": version, "arch": arch, "bytes": os.path.getsize(log),
                                        "tail": text})
            ops = os.path.join(arch_dir, "cached_ops")
            for module in listdir(ops):
                module_dir = os.path.join(ops, module)
                if module == "tmp" or not os.path.isdir(module_dir):
                    continue
                files = listdir(module_dir)
                library = os.path.join(module_dir, f"{module}.so")
                entry = {"version": version, "arch": arch, "module": module,
                         "library": os.path.isfile(library), "library_bytes": None, "library_mtime": None,
                         "objects": sum(1 for f in files if f.endswith(".o")),
                         "ninja": "build.ninja" in files}
                if entry["library"]:
                    stat = os.stat(library)
                    entry.update(library_bytes=stat.st_size, library_mtime=stat.st_mtime)
                out["modules"].append(entry)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
