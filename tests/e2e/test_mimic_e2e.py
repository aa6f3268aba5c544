"""The plugin against a later SGLang release (issue 25 item 5): `pytest --attach URL suites/smoke` on a
refserver started with `--mimic-version 0.5.23` (no meta_info aliases, no /get_load, /ready, launch_command,
served_model_name; docs/sglang-versions.md). Real pytest runs against real refservers."""

from __future__ import annotations

import pytest
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")


@pytest.mark.parametrize("algorithm", ["DFLASH", "DDTREE"])
def test_smoke_passes_on_0_5_23(run_suite, algorithm: str) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--mimic-version", "0.5.23", "--speculative-algorithm", algorithm) as server:
        result = run_suite("smoke", "--attach", server.url)
    assert_no_crash(result)
    data = verdict(run_suite.reports, host_name(server.url))
    assert data["tests_verdict"] == "pass", result.stdout.str()[-3000:]
    assert data["services"]["attached"]["algorithm"] == algorithm
    assert "acceptance:attached" in data["metrics"] or data["services"]["attached"].get("accept_length")
