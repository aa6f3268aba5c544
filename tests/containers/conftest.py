"""Container services for real: podman (runc, this machine's ulimits) running an image imported from the test
host's rootfs (tests/testhost/build.sh: Debian + /opt/dflash-venv), the checkout bind-mounted read-only at
/opt/pytest-dflash (the venv's .pth points there), so the refserver inside is this checkout's.

The rootfs is built (or waited for, while another worker or run builds it: build.sh holds a flock) the way the
testhost fixtures do, so `pytest tests` needs no setup step first. No engine, or a machine that cannot build
the rootfs: the tests skip with the reason, or fail under DFLASH_REQUIRE_CONTAINERS=1 (CI)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
_TESTHOST = str(Path(__file__).resolve().parents[1] / "testhost")
for _path in (_HERE, _TESTHOST):
    if _path not in sys.path:
        sys.path.insert(0, _path)

ENV_REQUIRE = "DFLASH_REQUIRE_CONTAINERS"
STAMPS = ("etc/dflash-testhost/base.stamp", "etc/dflash-testhost/config.stamp", "opt/dflash-venv/.dflash-deps")
IMAGE_REPO = "localhost/pytest-dflash-refserver"


import testhost as thapi  # noqa: E402
from container_helpers import PODMAN, podman  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "containers: needs a container engine (podman) and the test host's rootfs")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(_HERE):
            item.add_marker(pytest.mark.containers)


def unavailable(reason: str) -> None:
    """Skip, or fail under DFLASH_REQUIRE_CONTAINERS=1."""
    if os.environ.get(ENV_REQUIRE) == "1":
        pytest.fail(f"{ENV_REQUIRE}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine() -> str:
    """podman, usable here (runc: crun refuses this machine's hybrid cgroups; docs: shared/reference)."""
    if shutil.which("podman") is None:
        unavailable("podman is not installed (apt-get install -y podman runc)")
    if shutil.which("runc") is None:
        unavailable("runc is not installed (podman's default crun cannot run on hybrid cgroups)")
    if os.geteuid() != 0:
        unavailable("the container tests run rootful podman (needs root)")
    info = subprocess.run([*PODMAN, "info", "--format", "{{.Host.OCIRuntime.Name}}"], capture_output=True,
                          text=True, timeout=60, check=False)
    if info.returncode != 0:
        unavailable(f"podman info failed: {info.stderr.strip().splitlines()[-1:] or info.returncode}")
    return "podman"


@pytest.fixture(scope="session")
def testhost_rootfs(engine: str) -> Path:
    """The test host's rootfs (Debian + /opt/dflash-venv), from tests/testhost/build.sh as for the testhost
    tests: built when missing or stale (~1.5 min cold), waited for while another process builds it (build.sh
    holds a flock), < 1 s when current."""
    reason = thapi.can_run()
    if reason is not None:
        unavailable(f"cannot build the test host rootfs: {reason}")
    try:
        thapi.build()
    except (OSError, thapi.TestHostError) as e:
        pytest.fail(f"tests/testhost/build.sh failed: {e}", pytrace=False)
    rootfs = thapi.rootfs()
    missing = [s for s in STAMPS if not (rootfs / s).is_file()]
    assert not missing, f"build.sh left {rootfs} without {missing}"
    return rootfs


@pytest.fixture(scope="session")
def refserver_image(testhost_rootfs: Path) -> str:
    """The test host's rootfs as an image, imported once and cached by the rootfs's stamps (~30 s cold)."""
    rootfs = testhost_rootfs
    digest = hashlib.sha256(b"".join((rootfs / s).read_bytes() for s in STAMPS)).hexdigest()[:12]
    tag = f"{IMAGE_REPO}:{digest}"
    lock_path = Path("/tmp/pytest-dflash-image.lock")
    with open(lock_path, "w") as lock:  # xdist workers: one import
        fcntl.flock(lock, fcntl.LOCK_EX)
        if podman("image", "exists", tag, check=False).returncode != 0:
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            try:
                result = subprocess.run([*PODMAN, "import", "-", tag], stdin=tar.stdout, capture_output=True,
                                        text=True, timeout=300, check=False)
            finally:
                assert tar.stdout is not None
                tar.stdout.close()
                tar.wait(timeout=60)
            if result.returncode != 0:
                pytest.fail(f"podman import of {rootfs} failed: {result.stderr.strip()[-500:]}", pytrace=False)
    return tag


@pytest.fixture
def run_suite(pytester: pytest.Pytester, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Run a suite in a real pytest subprocess: run_suite("smoke", "--host", profile, ...) -> RunResult."""
    from container_helpers import SUITES

    reports = tmp_path / "reports"

    def run(suite: str, *args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(str(SUITES / suite), "-p", "no:cacheprovider",
                                             f"--dflash-report={reports}", "--request-timeout=20s", *args,
                                             timeout=240)

    run.reports = reports  # type: ignore[attr-defined]
    return run
