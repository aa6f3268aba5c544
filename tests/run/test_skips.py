"""The two kinds of skip (pytest_dflash/run/skips.py): every skip of the suites and the layers goes through
them, each kind reads back from its reason, and a "could not check" is never a pass in the verdict."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pytest_dflash.report.verdict import VerdictBuilder
from pytest_dflash.run import skips

ROOT = Path(__file__).parents[2]
WALKED = [ROOT / "suites", ROOT / "pytest_dflash" / "layers"]
# pytest's own ways to skip: a call or a marker with one of these names, reached through anything but run/skips
BARE = {"skip", "skipif", "importorskip"}


def bare_skips(path: Path) -> list[str]:
    """'file:line: what' for each skip in `path` that bypasses run/skips.py (pytest.skip, pytest.mark.skip,
    pytest.mark.skipif, pytest.importorskip, a `skip` imported from pytest, or pytest.skip.Exception)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "_pytest":
            found.append(f"{path}:{node.lineno}: imports from {node.module}")
        if isinstance(node, ast.ImportFrom) and node.module == "pytest":
            found += [f"{path}:{node.lineno}: from pytest import {a.name}" for a in node.names if a.name in BARE]
        if isinstance(node, ast.Attribute) and node.attr in BARE:
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id == "skips"):
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_skip_of_the_suites_and_layers_goes_through_the_classification() -> None:
    """A new bare pytest.skip (or skip marker) in suites/ or pytest_dflash/layers fails here: say which kind
    it is with skips.not_applicable / skips.could_not_check / skips.needs_sglang."""
    files = [f for root in WALKED for f in sorted(root.rglob("*.py"))]
    assert len(files) > 30  # the walk saw the tree
    found = [hit for f in files for hit in bare_skips(f)]
    assert not found, "skips that bypass pytest_dflash/run/skips.py:\n" + "\n".join(found)
    calls = sum(1 for f in files for node in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) in skips.__all__)
    assert calls >= 40, calls  # the classification is really what they call


def test_the_walker_sees_each_bare_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import pytest\nfrom pytest import skip\n\n@pytest.mark.skipif(True, reason='x')\n"
                      "def f():\n    pytest.skip('no')\n    pytest.importorskip('x')\n    skips.not_applicable('ok')\n")
    lines = [hit.split(":", 2)[1] for hit in bare_skips(sample)]
    assert lines == ["2", "4", "6", "7"]


@pytest.mark.parametrize(("raise_it", "kind"), [(skips.not_applicable, skips.NOT_APPLICABLE),
                                                 (skips.could_not_check, skips.UNCHECKED)])
def test_each_kind_reads_back_from_its_reason(raise_it, kind: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pytest.skip.Exception) as caught:
        raise_it("the reason")
    reason = str(caught.value.msg)
    assert skips.kind(reason) == kind
    assert reason.endswith("the reason")
    assert skips.kind("skipped by a user's own conftest") == skips.NOT_APPLICABLE


def _builder(*skipped: str, passed: int = 1) -> VerdictBuilder:
    builder = VerdictBuilder("r")
    info = {"host": "h", "layer": "service"}
    for n in range(passed):
        builder.add(f"t.py::test_ok{n}", "call", "passed", info, "")
    for n, message in enumerate(skipped):
        builder.add(f"t.py::test_skip{n}", "call", "skipped", info, message)
    return builder


def test_a_check_that_could_not_be_made_makes_the_host_partial_and_refuses_the_gate() -> None:
    builder = _builder("plain has no speculation", skips.UNCHECKED_PREFIX + "h/s: /server_info answered 503")
    verdict = builder.hosts["h"]
    assert verdict.final_verdict(builder.status) == "partial"
    assert verdict.partial_reasons(builder.status) == [
        "1 check(s) of the service layer could not be made (first: t.py::test_skip1: h/s: /server_info "
        "answered 503)"]
    assert verdict.layers["service"].unchecked == 1 and verdict.layers["service"].skipped == 2
    assert [e["kind"] for e in verdict.skipped] == [skips.NOT_APPLICABLE, skips.UNCHECKED]
    gate = builder.gate(["service"])
    assert not gate["passed"]
    assert gate["refused"] == ["h: 1 check(s) of the service layer could not be made (first: t.py::test_skip1: "
                               "h/s: /server_info answered 503)"]
    assert builder.gate(["host"])["refused"] == []  # a gate over other layers does not see it


def test_a_skip_that_does_not_apply_leaves_a_pass() -> None:
    builder = _builder("attached by URL: no host access")
    assert builder.hosts["h"].final_verdict(builder.status) == "pass"
    assert builder.gate(["service"])["passed"]


def test_where_a_skip_came_from_decides_its_kind() -> None:
    """The plugin's own vocabulary says its kind where it is raised; the plugin's own skip marker on a test with
    nothing to run against does not apply; any other skip (a conftest's marker, pytest.skip in a foreign fixture)
    was skipped from outside the profile, whatever its text says."""
    for raise_it, kind in ((skips.not_applicable, skips.NOT_APPLICABLE), (skips.could_not_check, skips.UNCHECKED)):
        with pytest.raises(pytest.skip.Exception) as caught:
            raise_it("why")
        assert skips.origin(caught.value, str(caught.value.msg)) == kind
    with pytest.raises(pytest.skip.Exception) as foreign:
        pytest.skip("could not check: known flaky")  # a foreign skip that borrows the vocabulary's words
    assert skips.origin(foreign.value, "could not check: known flaky") == skips.OUTSIDE
    own = "does not apply to gpu-a: no [parity] table"
    assert skips.origin(None, own, [own]) == skips.NOT_APPLICABLE
    assert skips.origin(None, "known flaky", [own]) == skips.OUTSIDE


def test_a_skip_from_outside_the_profile_makes_the_host_partial_and_refuses_the_gate() -> None:
    builder = VerdictBuilder("r")
    info = {"host": "h", "layer": "generation"}
    builder.add("t.py::test_ok", "call", "passed", info, "")
    builder.add("t.py::test_tool_call", "setup", "skipped", {**info, "skip": skips.OUTSIDE}, "known flaky")
    verdict = builder.hosts["h"]
    line = ("1 check(s) of the generation layer were skipped from outside the profile (a skip marker or "
            "pytest.skip that is not pytest-dflash's) (first: t.py::test_tool_call: known flaky)")
    assert verdict.final_verdict(builder.status) == "partial"
    assert verdict.partial_reasons(builder.status) == [line]
    assert [e["kind"] for e in verdict.skipped] == [skips.OUTSIDE] and verdict.layers["generation"].unchecked == 1
    gate = builder.gate(["generation"])
    assert not gate["passed"] and gate["why"] == [f"refused: h: {line}"]
