"""The package as its users get it: `python -m build` (sdist, then the wheel built from that sdist, in build's
isolated environment), and fresh venvs (`python -m venv`, no system site-packages, no .pth into this venv)
into which pip installs the wheel, resolving the declared dependencies from the package index the way a
user's `pip install 'pytest-dflash[EXTRA]'` does (this machine's pip config included: its local find-links
hold the CPU torch wheel).

Each artifact is made once per test session, also under xdist: the workers share one folder, and a flock per
artifact makes the second worker wait for the first one's instead of building its own."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What `python -m build` needs of a checkout (copied: an in-tree build leaves build/ and an egg-info behind).
SOURCES = ("pyproject.toml", "README.md", "pytest_dflash", "suites")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS",
               "PYTEST_PLUGINS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST")


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what would let a child see this checkout or this venv."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    return {**env, **(extra or {})}


def run(*args: str | Path, cwd: Path, timeout: float, env: Mapping[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=dict(env or clean_env()), capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"`{' '.join(map(str, args))}` exited {done.returncode}:\n"
                             f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def once(folder: Path, name: str, make: Callable[[Path], None]) -> Path:
    """folder/name, made by make(path) unless an earlier call of this session (any worker) made it."""
    folder.mkdir(parents=True, exist_ok=True)
    path, done = folder / name, folder / f"{name}.done"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)  # a worker that failed half-way
            started = time.monotonic()
            make(path)
            done.write_text(f"{time.monotonic() - started:.1f}\n")
    return path


def seconds_taken(folder: Path, name: str) -> float:
    return float((folder / f"{name}.done").read_text())


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path
    source: Path  # the copy of the checkout it was built from


def build_dists(out: Path) -> None:
    """`python -m build` of a copy of this checkout: the sdist, then the wheel from the sdist, into out/dist."""
    source = out / "src"
    source.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=IGNORED)
        else:
            shutil.copy2(ROOT / name, source / name)
    run(sys.executable, "-m", "build", "--outdir", out / "dist", source, cwd=out, timeout=300)


def dists(out: Path) -> Dists:
    (sdist,) = (out / "dist").glob("pytest_dflash-*.tar.gz")
    (wheel,) = (out / "dist").glob("pytest_dflash-*.whl")
    return Dists(sdist, wheel, out / "src")


def make_venv(wheel: Path, extras: str) -> Callable[[Path], None]:
    """A maker for once(): a fresh venv with `pip install 'WHEEL[extras]'`, dependencies from the index."""
    def make(path: Path) -> None:
        run(sys.executable, "-m", "venv", path, cwd=path.parent, timeout=120)
        requirement = f"{wheel}[{extras}]" if extras else str(wheel)
        # -q, and pip's "Location … is ignored" warnings about this machine's partial local index dropped;
        # --no-compile as .ci/run's own install: byte-compiling all of torch costs ~11 s of CPU, and the tests
        # import a small part of it (Python compiles that on import)
        run(path / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check",
            requirement, cwd=path.parent, timeout=900)
    return make


def venv_size(path: Path) -> str:
    return run("du", "-sh", path, cwd=path.parent, timeout=120).stdout.split()[0]
