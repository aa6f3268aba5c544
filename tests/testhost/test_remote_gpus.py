"""An 8-GPU host in the systemd test host: nvidia-smi answers with the H200's real output as an HGX board of
eight (tests/data/gpu/h200x8) and the kernel log holds NVIDIA's Xid 79 on GPU 5. DDTREE on GPU 0, DFLASH on
GPU 1 and a TP4 service on GPUs 4-7 are provisioned as systemd units over ssh: the host layer names GPU 5 (index,
bus id, UUID); the TP4 service, whose GPUs include it, is blocked naming it; the other two are tested and pass."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from remote_helpers import Guest, RefUnit, SuiteRun, unit_name, write_profile
from testhost import TestHost

pytest_plugins = ["remote_fixtures"]  # guest, runs
pytestmark = pytest.mark.testhost

STAND_INS = Path(__file__).parent / "gpus"
BAD = "GPU 5 (bus 0000:ab:00.0, GPU-caedbb52-a7ac-b6fb-867b-b909a3c8cf25)"


@pytest.fixture
def eight_gpus(guest: Guest) -> Iterator[None]:
    """nvidia-smi and dmesg of the 8-GPU board in the guest's /usr/local/bin (ahead of /usr/bin), then removed."""
    for tool in ("nvidia-smi", "dmesg"):
        guest.sh(f"install -m 0755 /opt/pytest-dflash/tests/testhost/gpus/{tool} /usr/local/bin/{tool}")
    try:
        yield
    finally:
        guest.sh("rm -f /usr/local/bin/nvidia-smi /usr/local/bin/dmesg", check=False)


@pytest.mark.heavy
def test_one_bad_gpu_of_eight_blocks_only_the_service_on_it(testhost: TestHost, guest: Guest, eight_gpus: None,
                                                           runs: Callable[..., SuiteRun], tmp_path: Path) -> None:
    units = {"ddtree": RefUnit(unit_name("g8-ddtree"), "DDTREE", gpus=(0,)),
             "dflash": RefUnit(unit_name("g8-dflash"), "DFLASH", gpus=(1,)),
             "tp4": RefUnit(unit_name("g8-tp4"), "NONE", args="--tp-size 4", gpus=(4, 5, 6, 7))}
    guest.track(*(u.unit for u in units.values()))
    profile = write_profile(tmp_path, testhost, "hgx", units)
    outcome = runs(profile, "--provision", suites=("host", "service", "generation")).wait(300)
    outcome.assert_clean()
    data = outcome.verdict("hgx")
    assert data["verdict"] == "fail" and data["layers"]["host"]["outcome"] == "failed", outcome.out[-4000:]
    host_failures = [f for f in data["failures"] if f["layer"] == "host"]
    xid = [f for f in host_failures if f["test"].endswith("test_kernel_log_has_no_gpu_faults[hgx]")]
    assert xid and xid[0]["gpus"] == [BAD], host_failures
    # the service on the bad GPU is blocked, naming it; the others ran and passed
    assert all(not f.get("services") for f in host_failures)
    failed_services = {s for f in data["failures"] for s in f.get("services", [])}
    assert failed_services == set(), data["failures"]
    blocked = [b for b in data["blocked"] if "tp4" in b.get("services", [])]
    assert blocked and all(BAD in str(b) for b in blocked), data["blocked"][:3]
    assert not [b for b in data["blocked"] if {"ddtree", "dflash"} & set(b.get("services", []))], data["blocked"]
    assert data["services"]["ddtree"]["ready"]["sampled_s"] is not None
    assert data["services"]["dflash"]["ready"]["sampled_s"] is not None
    assert data["facts"]["gpu_matrix"]["5"]["services"] == ["tp4"]

