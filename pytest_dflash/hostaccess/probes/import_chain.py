"""Probe: import the server's serving chains, each in a FRESH interpreter. Prints one JSON object.

Runs on the host under test with the server's python and environment (FLASHINFER_WORKSPACE_BASE
aside: a scratch directory, removed afterwards, so nothing is written into the service's JIT cache);
stdlib only; never imports pytest_dflash. One chain failing (soundfile) must not hide another
(xgrammar's StructuralTag), so every chain gets its own `python -c` child with its own deadline:

    {"probe": "import_chain", "python": "/venv/bin/python",
     "chains": [{"name": "http_server", "modules": ["sglang.srt.entrypoints.http_server"],
                 "ok": false, "rc": 1, "seconds": 21.3, "timed_out": false,
                 "imported": [{"module": "...", "seconds": 20.1, "file": "/venv/.../x.py"}],
                 "failed": {"module": "...", "type": "ModuleNotFoundError",
                            "message": "No module named 'soundfile'", "missing": "soundfile",
                            "owners": ["sglang"], "traceback": "<last lines>"} | null,
                 "stderr": "<tail>"}]}

argv[1]: JSON {"chains": [{"name": ..., "modules": [...]}], "timeout_s": 240, "parallel": 4}.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

MARK = "DFLASH-CHAIN "

CHILD = r'''
import importlib, json, os, sys, time, traceback
result = {"imported": [], "failed": None}
for name in sys.argv[1:]:
    started = time.monotonic()
    try:
        module = importlib.import_module(name)
    except BaseException as exc:
        missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        owners = []
        try:
            import importlib.metadata as md
            top = (missing or name).split(".")[0]
            owners = sorted(set(md.packages_distributions().get(top, [])))
        except Exception:
            pass
        # the importlib machinery's own frames say nothing about why the import failed
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<") and not f.filename.endswith("importlib/__init__.py")]
        text = ("".join(traceback.format_list(frames))
                + "".join(traceback.format_exception_only(type(exc), exc)))
        result["failed"] = {"module": name, "type": type(exc).__name__, "message": str(exc)[:4000],
                            "missing": missing, "owners": owners,
                            "traceback": "\n".join(text.strip().splitlines()[-60:])}
        break
    result["imported"].append({"module": name, "seconds": round(time.monotonic() - started, 3),
                               "file": getattr(module, "__file__", None)})
sys.stdout.write("@@MARK@@" + json.dumps(result) + "\n")
sys.stdout.flush()
os._exit(0)  # serving stacks leave threads behind; the answer is already out
'''.replace("@@MARK@@", MARK)


def run_chain(chain: dict, timeout_s: float, env: dict) -> dict:
    started = time.monotonic()
    out = {"name": chain["name"], "modules": list(chain["modules"]), "ok": False, "rc": None, "seconds": 0.0,
           "timed_out": False, "imported": [], "failed": None, "stderr": ""}
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, *chain["modules"]], capture_output=True,
                              text=True, errors="replace", timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        out.update(timed_out=True, seconds=round(time.monotonic() - started, 3), stderr=stderr[-4000:])
        return out
    out.update(rc=done.returncode, seconds=round(time.monotonic() - started, 3), stderr=done.stderr[-4000:])
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            result = json.loads(line[len(MARK):])
            out.update(imported=result["imported"], failed=result["failed"])
            break
    else:
        # no answer: the interpreter died (segfault in an extension, abort): the stderr is the evidence
        out["failed"] = {"module": None, "type": "InterpreterDied",
                         "message": f"exit status {done.returncode}", "missing": None, "owners": [],
                         "traceback": done.stderr[-4000:]}
    out["ok"] = out["failed"] is None and done.returncode == 0
    return out


def main() -> None:
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    chains = params.get("chains", [])
    timeout_s = float(params.get("timeout_s", 240))
    parallel = max(1, int(params.get("parallel", 4)))
    # Importing flashinfer creates its workspace (<base>/.cache/flashinfer/<version>/<arch>/): point it
    # at a scratch directory so probing never writes into the service's real JIT cache.
    scratch = tempfile.mkdtemp(prefix="dflash-import-")
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": scratch}
    try:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            results = list(pool.map(lambda chain: run_chain(chain, timeout_s, env), chains))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({"probe": "import_chain", "python": sys.executable, "chains": results}))


if __name__ == "__main__":
    main()
