"""In real pytest runs (no server: checks of the host and generation layers on `dflash_host`, suites laid out as
suites/<name>/): a skip that is not pytest-dflash's refuses a gate and names its reason (also across xdist);
choosing suites is a declared scope named in the verdict and the gate line, not a narrowing; a gated layer the
scope has no check of fails the gate as "not in scope"; --pyargs with --ignore is partial as the path form is;
and every failing gate says which layer and why (issue 39 item 3; issue 41's "every failing gate names the
layer and why")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.pytest_runs import EXTERNAL_DFLASH_PROFILE, verdict

ALPHA = """
import os
import pytest
from pytest_dflash.run import skips

@pytest.mark.host
def test_reachable(dflash_host):
    pass

@pytest.mark.host
def test_probe(dflash_host):
    assert not os.environ.get("FAIL_PROBE"), "the probe said no"

@pytest.mark.host
def test_innocent(dflash_host):
    skips.not_applicable("nothing to probe on this host")
"""

BETA = """
import os
import pytest

@pytest.mark.generation
def test_answers(dflash_host):
    assert not os.environ.get("FAIL_ANSWERS"), "the answer was wrong"
"""

# a conftest (or a plugin) that hides the failing check of a gated layer, in one of four ways (and one more: the api's not_applicable)
CONFTEST = """
import os
import pytest

def pytest_collection_modifyitems(config, items):
    how = os.environ.get("HIDE")
    for item in items:
        if "test_probe" not in item.nodeid:
            continue
        if how == "skip":
            item.add_marker(pytest.mark.skip(reason="known flaky"))
        elif how == "skipif":
            item.add_marker(pytest.mark.skipif(True, reason="known flaky on this rack"))

@pytest.fixture(autouse=True)
def hide_in_a_fixture(request):
    if os.environ.get("HIDE") == "fixture" and "test_probe" in request.node.nodeid:
        pytest.skip("flaky, skipped by our fixture")
    if os.environ.get("HIDE") == "api" and "test_probe" in request.node.nodeid:
        from pytest_dflash.api import not_applicable  # the plugin's own words, said by a conftest

        not_applicable("flaky, our fixture says it does not apply")
"""


@pytest.fixture
def tree(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pytester's folder as a package `gatepkg` holding suites/alpha (host layer) and suites/beta (generation),
    and the host gpu-a."""
    monkeypatch.setenv("DFLASH_STATE_DIR", str(pytester.path / "state"))
    for name in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS", "FAIL_PROBE", "FAIL_ANSWERS", "HIDE"):
        monkeypatch.delenv(name, raising=False)
    root = pytester.path / "gatepkg"
    for folder, files in {root: {}, root / "suites": {"conftest.py": CONFTEST},
                          root / "suites" / "alpha": {"test_alpha.py": ALPHA},
                          root / "suites" / "beta": {"test_beta.py": BETA}}.items():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
        for name, text in files.items():
            (folder / name).write_text(text)
    (pytester.path / "gpu-a.toml").write_text(EXTERNAL_DFLASH_PROFILE)
    return root


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", str(pytester.path / "gpu-a.toml"),
                                         f"--dflash-report={pytester.path / 'reports'}", *args)


def _verdict(pytester: pytest.Pytester) -> dict[str, Any]:
    return verdict(pytester.path / "reports", "gpu-a")


@pytest.mark.parametrize(("how", "reason"), [("skip", "known flaky"), ("skipif", "known flaky on this rack"),
                                             ("fixture", "flaky, skipped by our fixture"),
                                             ("api", "flaky, our fixture says it does not apply")])
@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_skip_from_outside_the_profile_refuses_the_gate_naming_its_reason(
        pytester: pytest.Pytester, tree: Path, monkeypatch: pytest.MonkeyPatch, how: str, reason: str,
        workers: list[str]) -> None:
    """Before: the failing check skipped by a conftest's marker gave `gate host: PASSED`, exit 0; so did a
    conftest's fixture calling the api's not_applicable (only the check itself or the plugin says that)."""
    monkeypatch.setenv("FAIL_PROBE", "1")
    monkeypatch.setenv("HIDE", how)
    result = _run(pytester, "gatepkg/suites", "--gate", "host", *workers)
    assert result.ret == 1, result.stdout.str()[-3000:]
    data = _verdict(pytester)
    assert data["verdict"] == "partial", data["verdict"]
    hidden = [s for s in data["skipped"] if "test_probe" in s["test"]]
    assert [s["kind"] for s in hidden] == ["skipped from outside the profile"], data["skipped"]
    innocent = [s for s in data["skipped"] if "test_innocent" in s["test"]]
    assert [(s["kind"], s["message"]) for s in innocent] == [("does not apply", "nothing to probe on this host")]
    line = (f"1 check(s) of the host layer were skipped from outside the profile (a skip marker or pytest.skip "
            f"that is not pytest-dflash's) (first: gatepkg/suites/alpha/test_alpha.py::test_probe[gpu-a]: {reason})")
    assert line in data["partial"], data["partial"]
    assert data["gate"]["passed"] is False and f"refused: gpu-a: {line}" in data["gate"]["why"], data["gate"]
    result.stdout.fnmatch_lines(["gate host: FAILED*", f"  gate refused: gpu-a: {line}"])


def test_without_a_hidden_check_the_same_gate_passes(pytester: pytest.Pytester, tree: Path) -> None:
    result = _run(pytester, "gatepkg/suites", "--gate", "host,generation")
    assert result.ret == 0, result.stdout.str()[-3000:]
    data = _verdict(pytester)
    assert data["verdict"] == "pass" and data["gate"]["why"] == [], data
    assert data["scope"]["whole"] and data["scope"]["text"] == "all 2 suites", data["scope"]
    result.stdout.fnmatch_lines(["scope: all 2 suites *", "gate host,generation: PASSED"])


def test_a_chosen_suite_is_a_declared_scope_not_a_narrowing(pytester: pytest.Pytester, tree: Path) -> None:
    """Before: `suites/beta --gate generation` ended verdict partial ("ran beta: 1 of 2 suites") with the gate
    PASSED and exit 0, while docs/gating.md said a partial host never passes a gate."""
    result = _run(pytester, "gatepkg/suites/beta", "--gate", "generation")
    assert result.ret == 0, result.stdout.str()[-3000:]
    data = _verdict(pytester)
    assert data["verdict"] == "pass" and data["complete"] is True, (data["verdict"], data["partial"])
    assert data["scope"] == {"suites": ["beta"], "available": ["alpha", "beta"], "paths": [], "whole": False,
                             "text": "beta (1 of 2 suites)"}
    assert data["gate"]["passed"] and data["gate"]["scope"]["text"] == "beta (1 of 2 suites)"
    result.stdout.fnmatch_lines(["gate generation: PASSED; scope: beta (1 of 2 suites)"])


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["no-xdist", "xdist"])
def test_a_gated_layer_outside_the_scope_fails_the_gate_as_not_in_scope(pytester: pytest.Pytester, tree: Path,
                                                                        workers: list[str]) -> None:
    result = _run(pytester, "gatepkg/suites/beta", "--gate", "host,generation", *workers)
    assert result.ret == 1, result.stdout.str()[-3000:]
    why = "failed: gpu-a host: not in scope: beta (1 of 2 suites) define(s) no check of the host layer"
    assert _verdict(pytester)["gate"]["why"] == [why]
    result.stdout.fnmatch_lines(["gate host,generation: FAILED on gpu-a; scope: beta (1 of 2 suites)", f"  gate {why}"])


def test_narrowing_inside_the_scope_is_partial_and_refuses_the_gate(pytester: pytest.Pytester, tree: Path) -> None:
    result = _run(pytester, "gatepkg/suites/alpha", "--gate", "host", "-k", "not probe")
    assert result.ret == 1, result.stdout.str()[-3000:]
    data = _verdict(pytester)
    assert data["verdict"] == "partial" and data["partial"][0] == "-k 'not probe'", data["partial"]
    assert data["gate"]["why"] == ["refused: the run was narrowed: -k 'not probe'",
                                   "refused: gpu-a: 1 test(s) deselected after collection"]
    result.stdout.fnmatch_lines(["gate host: FAILED; scope: alpha (1 of 2 suites)",
                                 "  gate refused: the run was narrowed: -k 'not probe'"])


@pytest.mark.parametrize("layer", ["host", "generation"])
def test_a_failing_gate_names_the_layer_and_the_failed_check(pytester: pytest.Pytester, tree: Path,
                                                             monkeypatch: pytest.MonkeyPatch, layer: str) -> None:
    monkeypatch.setenv("FAIL_PROBE" if layer == "host" else "FAIL_ANSWERS", "1")
    result = _run(pytester, "gatepkg/suites", "--gate", "host,generation")
    assert result.ret == 1
    test, said = (("alpha/test_alpha.py::test_probe[gpu-a]", "the probe said no") if layer == "host"
                  else ("beta/test_beta.py::test_answers[gpu-a]", "the answer was wrong"))
    why = _verdict(pytester)["gate"]["why"]
    assert why[0].startswith(f"failed: gpu-a {layer}: 1 check(s) failed (first: gatepkg/suites/{test}: "), why
    assert said in why[0], why
    if layer == "host":  # a host-wide failure blocks the generation layer: its line names the root
        assert why[1:] == [f"failed: gpu-a generation: 1 check(s) blocked: host layer failed on gpu-a "
                           f"(gatepkg/suites/{test}): AssertionError: {said}"], why
    else:
        assert len(why) == 1, why
    result.stdout.fnmatch_lines(["gate host,generation: FAILED on gpu-a*", f"  gate failed: gpu-a {layer}: *{said}*"])


@pytest.mark.parametrize("form", ["path", "pyargs"])
def test_ignore_leaves_the_host_partial_by_path_and_by_package(pytester: pytest.Pytester, tree: Path,
                                                               monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """Before: `--pyargs PKG.suites --ignore=PKG/suites/beta` over a failing beta gave `pass`, `complete`, no
    uncollected check and exit 0; the path form gave partial."""
    monkeypatch.setenv("FAIL_ANSWERS", "1")  # what the ignored suite would have said
    target = "gatepkg/suites" if form == "path" else "gatepkg.suites"
    pyargs = ["--pyargs"] if form == "pyargs" else []
    result = _run(pytester, *pyargs, target, f"--ignore={tree / 'suites' / 'beta'}", "--gate", "host")
    assert result.ret == 1, result.stdout.str()[-3000:]
    data = _verdict(pytester)
    assert data["verdict"] == "partial" and data["complete"] is False, data["verdict"]
    assert [u.rsplit("/", 1)[-1] for u in data["tests"]["uncollected"]] == [
        "test_beta.py (no test of it was collected)"], data["tests"]
    assert any("the run left them out: --ignore" in why for why in data["gate"]["why"]), data["gate"]["why"]


SECOND = """
import os
import pytest

@pytest.mark.host
def test_second(dflash_host):
    assert not os.environ.get("FAIL_SECOND"), "the second file said no"
"""


@pytest.mark.parametrize("form", ["path", "pyargs"])
def test_one_file_of_a_suite_is_a_narrowing_of_that_suite(pytester: pytest.Pytester, tree: Path,
                                                          monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """Before: `suites/alpha/test_alpha.py --gate host` (or `--pyargs PKG.suites.alpha.test_alpha`) declared the
    scope 'alpha (1 of 2 suites)' and passed the gate, exit 0, while alpha's other file held a failing check
    that never ran. Naming one file of a suite leaves the suite's other files out: they are uncollected."""
    (tree / "suites" / "alpha" / "test_alpha2.py").write_text(SECOND)
    monkeypatch.setenv("FAIL_SECOND", "1")
    target = (["gatepkg/suites/alpha/test_alpha.py"] if form == "path"
              else ["--pyargs", "gatepkg.suites.alpha.test_alpha"])
    result = _run(pytester, *target, "--gate", "host")
    assert result.ret == 1, result.stdout.str()[-3000:]
    data = _verdict(pytester)
    assert data["verdict"] == "partial" and data["complete"] is False, (data["verdict"], data["partial"])
    assert [u.rsplit("/", 1)[-1] for u in data["tests"]["uncollected"]] == [
        "test_alpha2.py (no test of it was collected)"], data["tests"]
    assert any("the run named one file of suite alpha" in why for why in data["gate"]["why"]), data["gate"]["why"]


def test_every_file_of_a_suite_named_is_the_suite(pytester: pytest.Pytester, tree: Path) -> None:
    """The healthy case: naming each of a suite's files is the suite, a pass of its scope."""
    (tree / "suites" / "alpha" / "test_alpha2.py").write_text(SECOND)
    result = _run(pytester, "gatepkg/suites/alpha/test_alpha.py", "gatepkg/suites/alpha/test_alpha2.py",
                  "--gate", "host")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert _verdict(pytester)["verdict"] == "pass"
