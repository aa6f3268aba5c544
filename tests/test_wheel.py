"""The suites ship in the wheel as `pytest_dflash.suites`: a wheel built from this checkout, installed with a plain
`pip install` into a fresh venv, runs `pytest --pyargs pytest_dflash.suites.smoke --host local` from a directory
that is not the clone and passes.

Offline and fast: the wheel is built without build isolation (this venv's setuptools) and installed with
--no-deps; the fresh venv sees this venv's other distributions (torch, fastapi, pytest-html, …) through a .pth
line naming a folder of links to them, which leaves out this venv's own (editable) pytest-dflash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SOURCES = ("pyproject.toml", "README.md", "pytest_dflash", "suites")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def _packages_on_disk() -> set[str]:
    found = set()
    for root, prefix in ((ROOT / "pytest_dflash", "pytest_dflash"), (ROOT / "suites", "pytest_dflash.suites")):
        for init in root.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join([prefix, *init.parent.relative_to(root).parts]))
    return found


def test_every_package_on_disk_is_listed_in_pyproject() -> None:
    """setuptools' find cannot map suites/ under pytest_dflash, so pyproject lists the packages by hand."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    missing = sorted(_packages_on_disk() - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml (or they miss the wheel): {missing}"
    assert config["package-dir"] == {"pytest_dflash.suites": "suites"}
    unpackaged = sorted(str(d.relative_to(ROOT)) for d in (ROOT / "suites").iterdir()
                        if d.is_dir() and any(d.glob("test_*.py")) and not (d / "__init__.py").exists())
    assert not unpackaged, f"suite folders without __init__.py are not installed: {unpackaged}"


def _run(*args: str | Path, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout[-4000:]}\n" \
                                 f"{done.stderr[-4000:]}"
    return done.stdout


def _fresh_venv(path: Path, scratch: Path) -> Path:
    """A venv without pip whose site-packages also reaches this venv's distributions, except pytest-dflash."""
    _run(sys.executable, "-m", "venv", "--without-pip", path, cwd=scratch)
    python = path / "bin" / "python"
    ours = Path(sysconfig.get_paths()["purelib"])
    shared = scratch / "shared-site-packages"
    shared.mkdir()
    for entry in ours.iterdir():
        name = entry.name
        if name.startswith(("pytest_dflash", "pytest-dflash", "__editable__")) or name.endswith(".pth"):
            continue
        (shared / name).symlink_to(entry)
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=scratch).strip()
    Path(purelib, "dflash-selftest-shared.pth").write_text(f"{shared}\n")
    return python


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_wheel_installed_in_a_fresh_venv_runs_the_smoke_suite_by_pyargs(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: the in-tree build would leave build/ and a stale egg-info in the clone
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=IGNORED)
        else:
            shutil.copy2(ROOT / name, source / name)
    # every file of the package and every suite module, as copied, must ship
    expected = {f"pytest_dflash/{p.relative_to(source / 'pytest_dflash').as_posix()}"
                for p in (source / "pytest_dflash").rglob("*") if p.is_file()}
    expected |= {f"pytest_dflash/suites/{p.relative_to(source / 'suites').as_posix()}"
                 for p in (source / "suites").rglob("*.py")}
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", dist, source, cwd=tmp_path)
    (wheel,) = dist.glob("pytest_dflash-*.whl")

    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert not sorted(expected - shipped), f"missing from the wheel: {sorted(expected - shipped)}"

    python = _fresh_venv(tmp_path / "venv", tmp_path)
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel,
         cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_STEP_SUMMARY")}
    where = _run(python, "-c", "import pytest_dflash.suites.smoke as s; print(s.__file__)", cwd=elsewhere, env=env)
    assert where.startswith(str(tmp_path / "venv")), where  # the installed copy, not this checkout

    out = _run(python, "-m", "pytest", "--pyargs", "pytest_dflash.suites.smoke", "--host", "local", "-q",
               "-p", "no:cacheprovider", cwd=elsewhere, env=env, timeout=180)
    assert "local: PASS" in out, out[-3000:]
    verdict = (elsewhere / "reports" / "local.verdict.json").read_text()
    data = json.loads(verdict)
    assert data["verdict"] == "pass" and data["complete"] and data["exit_code"] == 0, verdict[:2000]
    assert data["selection"]["suites"] == ["smoke"]
    assert data["profile"].startswith(str(tmp_path / "venv")), data["profile"]  # the builtin profile it ships
    assert set(data["services"]) == {"none", "dflash", "ddtree"}

    # One suite other than smoke, by --pyargs and under xdist (node ids relative to the package): still partial.
    host_only = _run(python, "-m", "pytest", "--pyargs", "pytest_dflash.suites.host", "--host", "local", "-q",
                     "-p", "no:cacheprovider", "-n", "2", "--dflash-report", "r2", cwd=elsewhere, env=env, timeout=180)
    data = json.loads((elsewhere / "r2" / "local.verdict.json").read_text())
    assert data["verdict"] == "partial" and data["selection"]["suites"] == ["host"], host_only[-3000:]
