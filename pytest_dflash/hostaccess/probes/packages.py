"""Probe: the installed distributions of the server's venv, as their own metadata says. Prints one JSON
object.

Runs on the host under test with the server's python and environment; stdlib only; never imports
pytest_dflash. Metadata only: nothing is imported, so a broken package cannot hide the others.

    {"probe": "packages", "python": "/venv/bin/python", "marker_env": {"python_version": "3.12", ...},
     "distributions": {"flashinfer-python": {"name": "flashinfer_python", "version": "0.6.15.post1",
                                             "location": "/venv/lib/python3.12/site-packages"}, ...},
     "shadowed": {"transformers": [{"version": "5.17.0", "location": "..."}]},
     "requires": {"sglang": ["torch==2.11.0", "soundfile==0.13.1", ...]},
     "pip_check": {"ran": true, "rc": 1, "stdout": "...", "stderr": "", "seconds": 4.2}}

Names are normalised (PEP 503). The first distribution of a name on sys.path wins, as it does for
imports; later ones are listed under `shadowed` (PYTHONPATH overlays make that common).
argv[1]: JSON {"requirers": ["sglang", ...], "pip_check": true, "timeout_s": 120}.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import re
import subprocess
import sys
import time


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_env() -> dict:
    impl = sys.implementation
    version = f"{impl.version.major}.{impl.version.minor}.{impl.version.micro}"
    if impl.version.releaselevel != "final":
        version += impl.version.releaselevel[0] + str(impl.version.serial)
    return {"implementation_name": impl.name, "implementation_version": version, "os_name": os.name,
            "platform_machine": platform.machine(), "platform_release": platform.release(),
            "platform_system": platform.system(), "platform_version": platform.version(),
            "python_full_version": platform.python_version(),
            "platform_python_implementation": platform.python_implementation(),
            "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}


def main() -> None:
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    requirers = [normalize(name) for name in params.get("requirers", [])]
    timeout_s = float(params.get("timeout_s", 120))
    distributions: dict = {}
    shadowed: dict = {}
    requires: dict = {}
    for dist in md.distributions():
        raw_name = dist.metadata.get("Name")
        if not raw_name:
            continue
        name = normalize(raw_name)
        location = str(dist.locate_file(""))
        if name in distributions:
            shadowed.setdefault(name, []).append({"version": dist.version, "location": location})
            continue
        distributions[name] = {"name": raw_name, "version": dist.version, "location": location}
        if name in requirers:
            requires[name] = list(dist.requires or [])
    check: dict = {"ran": False, "rc": None, "stdout": "", "stderr": "", "seconds": 0.0}
    if params.get("pip_check", True):
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True,
                                  timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
            check.update(ran=True, rc=done.returncode, stdout=done.stdout[-20000:],
                         stderr=done.stderr[-4000:])
        except (OSError, subprocess.TimeoutExpired) as exc:
            check.update(stderr=f"{type(exc).__name__}: {exc}")
        check["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps({"probe": "packages", "python": sys.executable, "marker_env": marker_env(),
                      "distributions": distributions, "shadowed": shadowed, "requires": requires,
                      "pip_check": check}))


if __name__ == "__main__":
    main()
