"""`python -m build` makes an sdist and a wheel that `twine check` accepts; the wheel (built from the sdist)
ships every module of the package and of the suites (as `pytest_dflash.suites`); the version is written once,
in pytest_dflash/__init__.py, and is the one the metadata, the file names and `pytest-dflash --version` show."""

from __future__ import annotations

import ast
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from install_venvs import ROOT, Dists, run


def _packages_on_disk() -> set[str]:
    found = set()
    for root, prefix in ((ROOT / "pytest_dflash", "pytest_dflash"), (ROOT / "suites", "pytest_dflash.suites")):
        for init in root.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join([prefix, *init.parent.relative_to(root).parts]))
    return found


def _source_version() -> str:
    """pytest_dflash.__version__ as written (read, not imported: the version the checkout says)."""
    tree = ast.parse((ROOT / "pytest_dflash" / "__init__.py").read_text())
    (value,) = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
                and isinstance(node.value, ast.Constant)]
    assert isinstance(value, str)
    return value


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


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pytest_dflash.__version__"}


@pytest.mark.timeout(900)  # the first test of a run to need the build makes it
def test_build_makes_an_sdist_and_a_wheel_twine_accepts(built: Dists) -> None:
    version = _source_version()
    assert built.sdist.name == f"pytest_dflash-{version}.tar.gz"
    assert built.wheel.name == f"pytest_dflash-{version}-py3-none-any.whl"
    out = run(sys.executable, "-m", "twine", "check", "--strict", built.sdist, built.wheel, cwd=built.sdist.parent,
              timeout=120).stdout
    assert out.count("PASSED") == 2, out


@pytest.mark.timeout(900)
def test_the_wheel_ships_every_module_of_the_package_and_the_suites(built: Dists) -> None:
    source = built.source
    expected = {f"pytest_dflash/{p.relative_to(source / 'pytest_dflash').as_posix()}"
                for p in (source / "pytest_dflash").rglob("*") if p.is_file()}
    expected |= {f"pytest_dflash/suites/{p.relative_to(source / 'suites').as_posix()}"
                 for p in (source / "suites").rglob("*.py")}
    shipped = set(zipfile.ZipFile(built.wheel).namelist())
    assert not sorted(expected - shipped), f"missing from the wheel: {sorted(expected - shipped)}"
    metadata = zipfile.ZipFile(built.wheel).read(f"pytest_dflash-{_source_version()}.dist-info/METADATA").decode()
    assert f"\nVersion: {_source_version()}\n" in metadata


@pytest.mark.timeout(900)
def test_the_installed_command_prints_the_version(base_venv: Path, elsewhere: Path) -> None:
    version = _source_version()
    out = run(base_venv / "bin" / "pytest-dflash", "--version", cwd=elsewhere, timeout=60).stdout
    assert out.strip() == f"pytest-dflash {version}", out
    installed = run(base_venv / "bin" / "python", "-c",
                    "import importlib.metadata as m, pytest_dflash; print(m.version('pytest-dflash'), "
                    "pytest_dflash.__version__)", cwd=elsewhere, timeout=60).stdout.split()
    assert installed == [version, version]
