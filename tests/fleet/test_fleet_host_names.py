"""Names that cannot collide (issue 31, item 5): two distinct hosts never share a verdict file, a history folder,
an HTML anchor or a Prometheus label, and an attached server keeps its name (host:port) from run to run. Real
pytest runs (pytester subprocesses); the attached servers are real refserver processes."""

from __future__ import annotations

import json

import pytest
from support.promparse import parse

from pytest_dflash.config.targets import file_name
from pytest_dflash.fleet.html import anchor
from pytest_dflash.fleet.values import safe_name
from pytest_dflash.refserver.launch import RefServerProcess

NAMES = ["alpha beta", "alpha:beta", "alpha_beta", "alpha%20beta", "alpha%3Abeta", "Alpha beta", "alpha-beta",
         "alpha.beta", "..", ".", ".x", "%2Ex", "café", "cafe\u0301", "127.0.0.1:8000", "127.0.0.1_8000",
         "fd00::1:30000", "fd00__1_30000", "a" * 300, "a" * 299 + "b", "é" * 200, "é" * 199 + "e", "x\ty", "x y"]


def test_file_names_are_injective_and_plain_ones_unchanged() -> None:
    encoded = [file_name(name) for name in NAMES]
    assert len(set(encoded)) == len(NAMES), sorted(encoded)
    assert [safe_name(name) for name in NAMES] == encoded  # history folders use the same encoding
    assert len({anchor(name) for name in NAMES}) == len(NAMES)
    assert file_name("gpu-a.lab") == "gpu-a.lab"
    assert file_name("127.0.0.1:8000") == "127.0.0.1_8000"  # an attached server's file keeps its name
    assert file_name("alpha beta") == "alpha%20beta" and file_name("alpha_beta") == "alpha%5Fbeta"
    for name in encoded:
        assert name not in (".", "..") and not name.startswith(".") and "/" not in name and ":" not in name
        assert len(name.encode()) <= 180 and name.isascii() and name.isprintable()


TEST_FILE = """
import os
import pytest

@pytest.mark.host
def test_host(dflash_host):
    assert dflash_host.name not in os.environ.get("BROKEN_HOSTS", "").split(","), "host check failed"
"""
PROFILE = """
[host]
name = "{name}"
connection = "local://"

[services.dflash]
kind = "external"
algorithm = "DFLASH"
url = "http://127.0.0.1:9"
"""


def test_alpha_beta_and_alpha_colon_beta_keep_their_own_verdicts(pytester: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, both wrote alpha_beta.verdict.json: the failing host's verdict was lost and the fleet summary
    said 1/1 pass while the terminal said FAIL."""
    pytester.makepyfile(test_names=TEST_FILE)
    (pytester.path / "a.toml").write_text(PROFILE.format(name="alpha beta"))
    (pytester.path / "b.toml").write_text(PROFILE.format(name="alpha:beta"))
    reports = pytester.path / "reports"
    args = ("-p", "no:cacheprovider", "--host", "a.toml", "--host", "b.toml", f"--dflash-report={reports}")
    first = pytester.runpytest_subprocess(*args)
    assert first.ret == 0, first.stdout.str()
    monkeypatch.setenv("BROKEN_HOSTS", "alpha beta")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines_random(["alpha beta: FAIL *", "alpha:beta: PASS *", "fleet: 1/2 hosts pass*"])
    verdicts = {path.name: json.loads(path.read_text()) for path in reports.glob("*.verdict.json")}
    assert {name: (data["host"], data["verdict"]) for name, data in verdicts.items()} == {
        "alpha%20beta.verdict.json": ("alpha beta", "fail"), "alpha_beta.verdict.json": ("alpha:beta", "pass")}
    summary = json.loads((reports / "fleet-summary.json").read_text())
    assert {host: entry["verdict"] for host, entry in summary["hosts"].items()} == {"alpha beta": "fail",
                                                                                  "alpha:beta": "pass"}
    assert sorted(p.name for p in (reports / "history").iterdir()) == ["alpha%20beta", "alpha_beta"]
    families = parse((reports / "fleet.prom").read_text())
    assert families["dflash_host_pass"].value(host="alpha beta") == 0
    assert families["dflash_host_pass"].value(host="alpha:beta") == 1


def test_a_host_name_given_by_two_profiles_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_names=TEST_FILE)
    (pytester.path / "a.toml").write_text(PROFILE.format(name="same"))
    (pytester.path / "b.toml").write_text(PROFILE.format(name="same").replace("127.0.0.1:9", "127.0.0.1:10"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", "a.toml", "--host", "b.toml",
                                           f"--dflash-report={pytester.path / 'reports'}")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --host b.toml: host 'same' is already the profile *a.toml; two hosts "
                                 "need two names*"])
    same = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", "a.toml", "--host", "a.toml",
                                         f"--dflash-report={pytester.path / 'reports'}")
    assert same.ret == 0, same.stdout.str()  # the same profile twice is one host
    same.assert_outcomes(passed=1)


SERVICE_TEST = """
import pytest

@pytest.mark.service
def test_ready(dflash_service):
    assert dflash_service.ready is not None
"""


def test_attached_servers_are_named_by_host_and_port_in_every_run(pytester: pytest.Pytester) -> None:
    """Before, the second --attach was `127.0.0.1:PORT#1`: swapping the order gave each server the other's
    verdict file and history."""
    pytester.makepyfile(test_attached=SERVICE_TEST)
    reports = pytester.path / "reports"
    with RefServerProcess("--speculative-algorithm", "NONE") as first, \
            RefServerProcess("--speculative-algorithm", "NONE") as second:
        names = {f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"}
        files = {f"127.0.0.1_{first.port}.verdict.json", f"127.0.0.1_{second.port}.verdict.json"}
        for urls in ([first.url, second.url], [second.url, first.url], [first.url, second.url, first.url]):
            attach = [arg for url in urls for arg in ("--attach", url)]
            result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *attach, f"--dflash-report={reports}")
            assert result.ret == 0, result.stdout.str()
            result.assert_outcomes(passed=2)  # the same URL twice is one host
            assert {p.name for p in reports.glob("*.verdict.json")} == files
            assert {json.loads((reports / name).read_text())["host"] for name in files} == names
            assert {p.name for p in (reports / "history").iterdir()} == {n.removesuffix(".verdict.json")
                                                                        for n in files}
        other_path = first.url.rstrip("/") + "/v1"
        clash = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--attach", first.url, "--attach",
                                              other_path, f"--dflash-report={reports}")
    assert clash.ret == 4
    clash.stderr.fnmatch_lines([f"ERROR: --attach {other_path}: host '127.0.0.1:{first.port}' is already "
                                f"--attach {first.url}*"])


def test_a_long_failure_message_is_cut_after_a_word_not_inside_one() -> None:
    """The summary keeps 500 characters of a failure's message: before, "… not answered yet befor"."""
    from pytest_dflash.scrub.bounds import clip

    message = "sampled phase not answered yet " * 20 + "before the deadline"
    kept = clip(message, 500)
    assert len(kept) <= 500 and kept.endswith("yet…") and message.startswith(kept[:-1])
    assert clip("short", 500) == "short"
