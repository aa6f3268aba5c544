"""Probe: the CUDA toolkit FlashInfer's JIT would compile with, in the server's environment. Prints one JSON
object.

Runs on the host under test with the server's python and environment; stdlib only; never imports
pytest_dflash (nor flashinfer: the resolution below is FlashInfer's own `jit/cpp_ext.py
get_cuda_path()` / `get_cuda_version()`, reproduced so it works even where flashinfer is broken):

  1. $CUDA_HOME, else $CUDA_PATH (an empty CUDA_HOME counts as unset);
  2. else `which nvcc` -> the directory above its bin/ (a wrapper in /usr/local/bin gives /usr/local!);
  3. else /usr/local/cuda if it exists;
  and the version is `release X.Y` from `<home>/bin/nvcc --version` (FlashInfer falls back to
  torch.version.cuda only when that fails; the controller applies that fallback).

    {"probe": "cuda_toolkit", "env": {"CUDA_HOME": ..., "PATH": ..., "CPATH": ...},
     "which_nvcc": "/usr/local/bin/nvcc" | null,
     "resolution": {"home": "/usr/local", "source": "which nvcc", "error": null},
     "nvcc": {"path": "/usr/local/bin/nvcc", "exists": true, "rc": 0, "release": "13.0", "text": "..."},
     "nvcc_dryrun": {"rc": 0, "top": "/usr/local/cuda-13.0/bin/..", "includes": ["/usr/local/cuda-13.0/..."]},
     "include_dirs": [...], "headers": {"curand.h": "/path/curand.h" | null, "curand_kernel.h": ..., ...},
     "library_dirs": [...], "libraries": {"cudart": "/path/libcudart.so" | null, "cuda": ... | null},
     "cxx": "/usr/bin/c++" | null, "ninja": "/venv/bin/ninja" | null (FlashInfer runs `ninja` from PATH),
     "toolkits": [{"home": "/usr/local/cuda-12.9", "real": "/usr/local/cuda-12.9", "release": "12.9"}]}

argv[1]: JSON {"timeout_s": 30}.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

ENV_KEYS = ("CUDA_HOME", "CUDA_PATH", "PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH",
            "LD_LIBRARY_PATH", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE",
            "FLASHINFER_EXTRA_LDFLAGS", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "CUDA_VISIBLE_DEVICES",
            "HOME")
HEADERS = ("cuda_runtime.h", "cuda.h", "curand.h", "curand_kernel.h")
RELEASE = re.compile(r"release (\d+\.\d+),")


def run(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout_s,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return done.returncode, done.stdout + done.stderr


def resolve_home() -> tuple[str | None, str | None, str | None]:
    """FlashInfer's get_cuda_path(): (home, source, error)."""
    for key in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(key):
            return os.environ[key], key, None
    which = shutil.which("nvcc")
    if which:
        return os.path.dirname(os.path.dirname(which)), "which nvcc", None
    if os.path.exists("/usr/local/cuda"):
        return "/usr/local/cuda", "/usr/local/cuda", None
    return None, None, "Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist"


def nvcc_release(nvcc: str, timeout_s: float) -> tuple[int | None, str | None, str]:
    rc, text = run([nvcc, "--version"], timeout_s)
    match = RELEASE.search(text)
    return rc, (match.group(1) if match and rc == 0 else None), text.strip()[-2000:]


def dryrun(nvcc: str, timeout_s: float) -> dict:
    """nvcc's own include dirs (what it adds besides -I/-isystem), from --dryrun."""
    rc, text = run([nvcc, "--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"], timeout_s)
    includes: list[str] = []
    top = None
    for line in text.splitlines():
        line = line.removeprefix("#$ ").strip()
        if line.startswith("TOP="):
            top = line.split("=", 1)[1]
        if line.startswith("INCLUDES="):
            value = line.split("=", 1)[1].strip().strip('"')
            for token in shlex.split(value):
                if token.startswith("-I"):
                    includes.append(token[2:].strip('"'))
    return {"rc": rc, "top": top, "includes": includes, "text": text.strip()[-3000:] if rc else ""}


def split_paths(value: str | None) -> list[str]:
    return [part for part in (value or "").split(":") if part]


def gcc_library_dirs(cxx: str | None, timeout_s: float) -> list[str]:
    if cxx is None:
        return []
    _rc, text = run([cxx, "-print-search-dirs"], timeout_s)
    for line in text.splitlines():
        if line.startswith("libraries:"):
            return [os.path.normpath(p) for p in line.split("=", 1)[-1].split(":") if p]
    return []


def find(name: str, dirs: list[str]) -> str | None:
    for directory in dirs:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None


def toolkits(timeout_s: float) -> list[dict]:
    found = []
    for home in sorted(glob.glob("/usr/local/cuda*")) + sorted(glob.glob("/opt/cuda*")):
        nvcc = os.path.join(home, "bin", "nvcc")
        if os.path.isfile(nvcc):
            _, release, _ = nvcc_release(nvcc, timeout_s)
            found.append({"home": home, "real": os.path.realpath(home), "release": release})
    return found


def main() -> None:
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    timeout_s = float(params.get("timeout_s", 30))
    home, source, error = resolve_home()
    out: dict = {"probe": "cuda_toolkit", "env": {k: os.environ.get(k) for k in ENV_KEYS},
                 "which_nvcc": shutil.which("nvcc"),
                 "resolution": {"home": home, "source": source, "error": error},
                 "nvcc": None, "nvcc_dryrun": None, "include_dirs": [], "headers": {}, "library_dirs": [],
                 "libraries": {}, "cxx": shutil.which("c++"), "ninja": shutil.which("ninja"),
                 "toolkits": toolkits(timeout_s)}
    if home is not None:
        nvcc = os.path.join(home, "bin", "nvcc")
        rc, release, text = nvcc_release(nvcc, timeout_s) if os.path.exists(nvcc) else (None, None, "")
        out["nvcc"] = {"path": nvcc, "exists": os.path.exists(nvcc), "rc": rc, "release": release,
                       "text": text}
        dry = dryrun(nvcc, timeout_s) if os.path.exists(nvcc) else {"rc": None, "top": None, "includes": []}
        out["nvcc_dryrun"] = dry
        # The order nvcc + the host compiler search: -I/-isystem from FlashInfer, nvcc's own, then CPATH & co.
        include_dirs = [os.path.join(home, "include"), *dry["includes"],
                        *split_paths(os.environ.get("CPATH")),
                        *split_paths(os.environ.get("CPLUS_INCLUDE_PATH")),
                        *split_paths(os.environ.get("C_INCLUDE_PATH"))]
        out["include_dirs"] = list(dict.fromkeys(os.path.normpath(d) for d in include_dirs))
        out["headers"] = {name: find(name, out["include_dirs"]) for name in HEADERS}
        # FlashInfer links with `$cxx ... -L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda`
        library_dirs = [os.path.join(home, "lib64"), os.path.join(home, "lib64", "stubs"),
                        *split_paths(os.environ.get("LIBRARY_PATH")),
                        *gcc_library_dirs(out["cxx"], timeout_s)]
        out["library_dirs"] = list(dict.fromkeys(os.path.normpath(d) for d in library_dirs))
        out["libraries"] = {lib: find(f"lib{lib}.so", out["library_dirs"]) for lib in ("cudart", "cuda")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
