"""check_served_algorithm: the algorithm /server_info reports is the profile's (shared by suites/service and smoke)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dflash.config.loader import attach_profile, load_profile
from pytest_dflash.layers.generation import checks as generation
from pytest_dflash.run import discovery
from pytest_dflash.run.handle import ServiceHandle
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun

LOCAL = Path(__file__).parents[3] / "pytest_dflash" / "config" / "builtin" / "local.toml"


def _local(service: str, server_info: dict[str, object] | None) -> ServiceHandle:
    profile = load_profile(LOCAL)
    handle = DflashRun({profile.name: profile}, RunOptions(), "r1").host(profile.name).service(service)
    handle.server_info = server_info  # what ensure_ready() stores from GET /server_info
    return handle


def test_a_dflash_profile_served_by_plain_decoding_fails_naming_both() -> None:
    plain = _local("dflash", {"version": "0.5.17", "speculative_algorithm": None})  # SGLang without --speculative-*
    assert generation.served_algorithm_unknown(plain) is None
    with pytest.raises(AssertionError, match=r"local/dflash: the profile says DFLASH, the server runs NONE "
                                             r"\(server_info speculative_algorithm\)"):
        generation.check_served_algorithm(plain)


def test_the_profiles_algorithm_passes_whatever_its_case() -> None:
    generation.check_served_algorithm(_local("ddtree", {"speculative_algorithm": "ddtree"}))
    generation.check_served_algorithm(_local("none", {"speculative_algorithm": None}))


def _attached(answers: dict[str, dict[str, str]] | None) -> ServiceHandle:
    profile = attach_profile("http://127.0.0.1:30000")
    profiles = discovery.apply({profile.name: profile}, answers or {})
    return DflashRun(profiles, RunOptions(), "r1").host(profile.name).service("attached")


def test_without_server_info_or_an_algorithm_nothing_is_compared() -> None:
    assert generation.served_algorithm_unknown(_local("dflash", None))
    never_asked = _attached(None)  # AUTO, discovery never ran (outside the plugin)
    never_asked.server_info = {"speculative_algorithm": "DFLASH"}
    assert "was not read before the tests were selected" in str(generation.served_algorithm_unknown(never_asked))


def test_an_attached_server_is_compared_with_what_it_said_at_collection() -> None:
    attached = _attached({"127.0.0.1:30000/attached": {"algorithm": "DFLASH"}})
    attached.server_info = {"speculative_algorithm": "DFLASH"}
    assert attached.spec.algorithm == "DFLASH" and generation.served_algorithm_unknown(attached) is None
    generation.check_served_algorithm(attached)
    attached.server_info = {"speculative_algorithm": None}  # restarted without speculation since collection
    with pytest.raises(AssertionError, match="the profile says DFLASH, the server runs NONE"):
        generation.check_served_algorithm(attached)


def test_an_attached_server_that_could_not_be_asked_fails_with_why() -> None:
    attached = _attached({"127.0.0.1:30000/attached": {"error": "ConnectError: [Errno 111] Connection refused"}})
    attached.server_info = {"speculative_algorithm": "DFLASH"}
    assert generation.served_algorithm_unknown(attached) is None
    with pytest.raises(AssertionError, match=r"could not be read before the tests were selected \(ConnectError"):
        generation.check_served_algorithm(attached)
