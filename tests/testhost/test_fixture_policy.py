"""The ``testhost`` fixture's policy when no test host can run here: a skip with the exact reason,
or a failure under DFLASH_REQUIRE_TESTHOST=1 (CI). Runs anywhere (no root needed): can_run() is
replaced in a pytest subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
REASON = "not root (uid 1000): netns, cgroups and systemd-nspawn need root"


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("DFLASH_REQUIRE_TESTHOST", raising=False)
    monkeypatch.delenv("DFLASH_TESTHOST_STATE", raising=False)
    pytester.makeconftest(
        f"""
import sys
sys.path.insert(0, {HERE!r})
import testhost
testhost.can_run = lambda: {REASON!r}
pytest_plugins = ["testhost_plugin"]
"""
    )
    pytester.makepyfile("def test_uses_host(testhost):\n    pass\n")
    return pytester


def test_skips_with_the_reason(inner: pytest.Pytester) -> None:
    res = inner.runpytest_subprocess("-rs")
    res.assert_outcomes(skipped=1)
    res.stdout.fnmatch_lines([f"*test host unavailable: {REASON}*"])


def test_fails_with_the_reason_when_required(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_REQUIRE_TESTHOST", "1")
    res = inner.runpytest_subprocess()
    res.assert_outcomes(errors=1)
    res.stdout.fnmatch_lines([f"*test host unavailable: {REASON} (DFLASH_REQUIRE_TESTHOST=1)*"])


def test_named_instance_that_is_gone_fails(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_TESTHOST_STATE", str(inner.path / "no-such-instance"))
    res = inner.runpytest_subprocess()
    res.assert_outcomes(errors=1)
    res.stdout.fnmatch_lines(["*DFLASH_TESTHOST_STATE=*no-such-instance*"])


def test_users_of_the_fixture_get_the_marker(inner: pytest.Pytester) -> None:
    inner.makeini("[pytest]\nmarkers =\n    testhost: needs the test host\n")
    res = inner.runpytest_subprocess("-m", "not testhost")
    res.assert_outcomes(deselected=1)
