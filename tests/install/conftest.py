"""Fixtures of the install tests: the sdist and wheel `python -m build` makes of this checkout, and fresh venvs
with the wheel installed by pip as a user installs it (install_venvs.py). Made once per session, shared by the
xdist workers of one run (a folder under the run's common basetemp).

The venvs come from the package index: no network to it, the tests fail (CI reaches it, as users do)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from install_venvs import Dists, build_dists, dists, make_venv, once  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "install: builds the sdist + wheel and installs them into fresh venvs "
                                       "from the package index")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(_HERE):
            item.add_marker(pytest.mark.install)


@pytest.fixture(scope="session")
def install_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """One folder for the whole run: under xdist each worker's basetemp is a child of the run's."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if worker_id != "master" else base) / "install"


@pytest.fixture(scope="session")
def built(install_dir: Path) -> Dists:
    return dists(once(install_dir, "build", build_dists))


@pytest.fixture(scope="session")
def base_venv(install_dir: Path, built: Dists) -> Path:
    """The controller: `pip install pytest-dflash` (no extra)."""
    return once(install_dir, "venv-base", make_venv(built.wheel, ""))


@pytest.fixture(scope="session")
def refserver_venv(install_dir: Path, built: Dists) -> Path:
    """`pip install 'pytest-dflash[refserver]'`: the controller plus the embedded reference host."""
    return once(install_dir, "venv-refserver", make_venv(built.wheel, "refserver"))


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory that is not this checkout (no conftest, no pyproject, no suites/ beside it)."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path
