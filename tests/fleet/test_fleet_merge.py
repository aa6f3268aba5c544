"""`pytest-dflash merge`: shards -> one summary (JSON, HTML, JUnit, Prometheus), exit codes, one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from support.fleet_helpers import BROKEN, GREEN, make_verdict
from support.promparse import parse

from pytest_dflash.cli import main

CLI = [sys.executable, "-m", "pytest_dflash.cli"]


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """Two CI shards' artifacts, one folder each: gpu-a + gpu-b green, gpu-c broken (FlashInfer)."""
    root = tmp_path / "artifacts"
    make_verdict(root / "shard-1", "gpu-a", GREEN, run_id="shard1")
    make_verdict(root / "shard-1", "gpu-c", BROKEN, run_id="shard1")
    make_verdict(root / "shard-2", "gpu-b", GREEN, run_id="shard2")
    return root


def test_merge_of_shards_writes_every_output(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet"
    assert main(["merge", str(shards / "shard-1"), str(shards / "shard-2"), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "3 verdicts from 2 run(s)" in printed and "fleet: 2/3 hosts pass" in printed
    summary = json.loads((out / "fleet-summary.json").read_text())
    assert summary["schema"] == "pytest-dflash/fleet-summary/1"
    assert summary["run_ids"] == ["shard1", "shard2"]
    assert {h: e["verdict"] for h, e in summary["hosts"].items()} == {"gpu-a": "pass", "gpu-b": "pass",
                                                                       "gpu-c": "fail"}
    assert summary["hosts"]["gpu-c"]["layers"] == {"host": "passed", "env": "not-run", "kernels": "not-run",
                                                   "service": "failed", "generation": "blocked",
                                                   "parity": "not-run", "perf": "not-run"}
    (failure,) = summary["hosts"]["gpu-c"]["failures"]
    assert failure["layer"] == "service" and failure["diagnosis"][0]["id"] == "flashinfer-sm12x-nvcc"
    assert summary["diagnoses"] == {"flashinfer-sm12x-nvcc": {"title": "FlashInfer JIT cannot build for SM 12.x",
                                                              "hosts": ["gpu-c"]}}
    assert summary["totals"]["layers"]["service"] == {"passed": 2, "failed": 1, "blocked": 0, "skipped": 0,
                                                      "not-run": 0}
    # JUnit: one testcase per host x layer
    suites = ET.parse(out / "fleet-junit.xml").getroot()
    cases = suites.findall("./testsuite/testcase")
    assert len(cases) == 3 * 7 and suites.get("tests") == "21" and suites.get("failures") == "1"
    (failed,) = [c for c in cases if c.find("failure") is not None]
    assert (failed.get("classname"), failed.get("name")) == ("dflash.gpu-c", "service")
    assert failed.find("failure").get("type") == "flashinfer-sm12x-nvcc"  # type: ignore[union-attr]
    blocked = [c for c in cases if (s := c.find("skipped")) is not None and s.get("type") == "blocked"]
    assert [(c.get("classname"), c.get("name")) for c in blocked] == [("dflash.gpu-c", "generation")]
    # HTML: the matrix, the failing cell links to the host section with the diagnosis
    page = (out / "fleet-summary.html").read_text()
    assert "<script src" not in page and "<link" not in page and "http://" not in page.replace(
        "http://127.0.0.1:30001", "")
    assert 'href="#h-gpu-c"' in page and '<article id="h-gpu-c">' in page
    assert "flashinfer-sm12x-nvcc" in page and "remedy: install CUDA 12.9+" in page
    assert page.index('data-host="gpu-c"') < page.index('data-host="gpu-a"'), "failing hosts first"
    # Prometheus
    families = parse((out / "fleet.prom").read_text())
    assert {s["host"]: families["dflash_host_pass"].value(**s) for s in families["dflash_host_pass"].series()} == {
        "gpu-a": 1, "gpu-b": 1, "gpu-c": 0}
    # history: the good verdicts are kept for "what changed"
    assert sorted(p.parent.name for p in (out / "history").glob("*/last-good.verdict.json")) == ["gpu-a", "gpu-b"]


def test_folder_is_searched_recursively_but_not_its_history(shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    assert main(["merge", str(shards), "--out", str(out), "-q"]) == 1
    # merging the output folder itself (verdicts copied in, history/ and summaries beside them) is fine
    for path in shards.rglob("*.verdict.json"):
        shutil.copy(path, out)
    assert main(["merge", str(out), "--out", str(out), "-q"]) == 1
    summary = json.loads((out / "fleet-summary.json").read_text())
    assert sorted(summary["hosts"]) == ["gpu-a", "gpu-b", "gpu-c"]


def test_gate_exclude_and_exit_codes(shards: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "fleet")
    assert main(["merge", str(shards), "--out", out, "-q", "--gate", "service,generation"]) == 1
    assert main(["merge", str(shards), "--out", out, "-q", "--gate", "host"]) == 0
    assert main(["merge", str(shards), "--out", out, "-q", "--gate", "service,generation", "--exclude", "gpu-c"]) == 0
    summary = json.loads((tmp_path / "fleet" / "fleet-summary.json").read_text())
    assert sorted(summary["hosts"]) == ["gpu-a", "gpu-b"] and summary["excluded"] == ["gpu-c"]
    assert summary["gate"] == {"layers": ["service", "generation"], "passed": True, "hosts": 2, "failing": {}}
    assert main(["merge", str(shards), "--out", out, "-q", "--exclude", "gpu-?"]) == 2  # nothing left
    assert main(["merge", str(shards), "--out", out, "-q", "--exclude", "gpu-c", "--expect-hosts", "3"]) == 1
    assert main(["merge", str(shards), "--out", out, "-q", "--gate", "parity"]) == 1  # not-run never passes a gate


def test_gate_defaults_to_the_one_the_runs_used(tmp_path: Path) -> None:
    make_verdict(tmp_path / "in", "gpu-a", GREEN, gate=["host", "service"])
    make_verdict(tmp_path / "in", "gpu-b", {"host": "passed", "service": "passed", "perf": "failed"},
                 gate=["host", "service"])
    assert main(["merge", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "-q"]) == 0
    summary = json.loads((tmp_path / "out" / "fleet-summary.json").read_text())
    assert summary["gate"]["layers"] == ["host", "service"] and summary["gate"]["passed"]
    assert summary["totals"]["fail"] == 1


def test_identical_duplicates_collapse_conflicting_ones_are_an_error(shards: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "again"
    shutil.copytree(shards / "shard-2", copy)
    out = str(tmp_path / "fleet")
    assert main(["merge", str(shards), str(copy), "--out", out, "-q"]) == 1  # the same artifact twice
    make_verdict(tmp_path / "rerun", "gpu-b", BROKEN, run_id="rerun", finished=4102444800)  # year 2100
    capsys.readouterr()
    assert main(["merge", str(shards), str(tmp_path / "rerun"), "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "conflicting verdicts for host 'gpu-b'" in err and "shard-2/gpu-b.verdict.json" in err
    assert "rerun/gpu-b.verdict.json" in err and "--latest" in err
    assert main(["merge", str(shards), str(tmp_path / "rerun"), "--out", out, "-q", "--latest"]) == 1
    summary = json.loads((tmp_path / "fleet" / "fleet-summary.json").read_text())
    assert summary["hosts"]["gpu-b"]["run_id"] == "rerun"


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: None, "no such file or folder"),
    (lambda d: d.mkdir(), "no *.verdict.json files in this folder"),
    (lambda d: d.write_text("{not json"), "not a pytest-dflash verdict (not JSON"),
    (lambda d: d.write_text("[" * 100_000), "not a pytest-dflash verdict (JSON nested too deep"),
    (lambda d: d.write_text('{"schema": "pytest-dflash/verdict/1", "x": ' + "[" * 100 + "]" * 100 + "}"),
     "not a pytest-dflash verdict (JSON nested too deep"),
    (lambda d: d.write_text('{"schema": "junit"}'), "not a pytest-dflash verdict (schema 'junit'"),
    (lambda d: d.write_text('[1, 2]'), "not a pytest-dflash verdict (schema 'list'"),
    (lambda d: d.write_text('{"schema": "pytest-dflash/verdict/1", "host": "x", "verdict": "maybe", "layers": {}}'),
     "invalid verdict: 'verdict' must be one of pass, fail, partial, interrupted"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.verdict.json" if "json" in message or "verdict" in message else tmp_path / "bad"
    make(bad)
    out = tmp_path / "out"
    result = subprocess.run([*CLI, "merge", str(bad), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"pytest-dflash merge: error: {bad}") and message in result.stderr
    assert not out.exists()


def test_bad_previous_and_usage_errors(shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (tmp_path / "prev.json").write_text('{"schema": "something else"}')
    (tmp_path / "deep.json").write_text("[" * 100_000)
    for args, text in [(["--previous", str(tmp_path / "nope.json")], "--previous"),
                       (["--previous", str(tmp_path / "prev.json")], "not a fleet summary"),
                       (["--previous", str(tmp_path / "deep.json")], "not a fleet summary (JSON nested too deep")]:
        result = subprocess.run([*CLI, "merge", str(shards), "--out", str(out), *args], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2 and text in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert not out.exists()
    result = subprocess.run([*CLI, "merge", str(shards), "--out", str(out), "--gate", "hosts"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "unknown layer 'hosts'" in result.stderr
    (tmp_path / "file").write_text("")
    assert main(["merge", str(shards), "--out", str(tmp_path / "file"), "-q"]) == 2


def test_console_script_is_installed(shards: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("pytest-dflash")
    if not script.exists():
        pytest.skip("the console script is not installed in this environment (pip install -e .)")
    result = subprocess.run([str(script), "merge", str(shards), "--out", str(tmp_path / "o"), "--gate", "host"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and "gate host: PASSED" in result.stdout


def test_unwritable_output_is_exit_3(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    assert main(["merge", str(shards), "--out", str(tmp_path / "file" / "sub"), "-q"]) == 3
    assert "cannot write the summary" in capsys.readouterr().err


def test_merge_refuses_shards_that_ran_different_gates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "artifacts"
    make_verdict(root / "shard-1", "gpu-a", GREEN, run_id="shard1", gate=["host", "service"])
    make_verdict(root / "shard-2", "gpu-b", GREEN, run_id="shard2", gate=["service"])
    assert main(["merge", str(root), "--out", str(tmp_path / "fleet")]) == 2
    err = capsys.readouterr().err
    assert "the shards disagree on the gate (host,service; service)" in err
    assert not (tmp_path / "fleet" / "fleet-summary.json").exists()
    # saying which gate applies resolves it
    assert main(["merge", str(root), "--out", str(tmp_path / "fleet"), "--gate", "service"]) == 0


@pytest.mark.parametrize("change", ["exit_code", "interrupted", "refused"])
def test_merge_gate_honours_a_shard_that_did_not_run_properly(tmp_path: Path, change: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "artifacts"
    make_verdict(root / "shard-1", "gpu-a", GREEN, run_id="shard1", gate=["service"])
    path = make_verdict(root / "shard-2", "gpu-b", GREEN, run_id="shard2", gate=["service"])
    data = json.loads(path.read_text())
    if change == "exit_code":
        data["exit_code"] = 2  # the shard was interrupted or broke: its green layers prove nothing
        data["verdict"], data["interrupted"], data["complete"] = "interrupted", "interrupted (Ctrl-C)", False
    elif change == "interrupted":
        data["verdict"], data["interrupted"] = "interrupted", "stopped early: stopping after 1 failures"
        data["complete"], data["exit_code"] = False, 1
    else:
        data["gate"]["refused"] = ["outside the dflash tests: collection error in suites/x.py"]
    path.write_text(json.dumps(data))
    assert main(["merge", str(root), "--out", str(tmp_path / "fleet")]) == 1
    summary = json.loads((tmp_path / "fleet" / "fleet-summary.json").read_text())
    assert summary["gate"]["passed"] is False and "gpu-b" in summary["gate"]["failing"]
    assert "gpu-a" not in summary["gate"]["failing"]


def test_merge_counts_partial_hosts_as_not_passing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "artifacts"
    path = make_verdict(root, "gpu-a", GREEN, run_id="r1")
    data = json.loads(path.read_text())
    data["verdict"], data["partial"], data["complete"] = "partial", ["-m 'service'"], False
    path.write_text(json.dumps(data))
    assert main(["merge", str(root), "--out", str(tmp_path / "fleet")]) == 1
    assert "fleet: one host, gpu-a: PARTIAL" in capsys.readouterr().out
    assert not (tmp_path / "fleet" / "history" / "gpu-a" / "last-good.verdict.json").exists()


def test_a_shard_whose_verdict_holds_escapes_gives_outputs_with_none_raw(tmp_path: Path) -> None:
    """A shard's verdict file is input (another run, an older plugin): its text is not trusted to be clean."""
    path = make_verdict(tmp_path / "shard", "gpu-c", BROKEN)
    data = json.loads(path.read_text())
    data["failures"][0]["message"] = "\x1b[2J\x1b]0;PWNED\x07 boom\n::error::injected\n##vso[task.complete]"
    path.write_text(json.dumps(data))
    out = tmp_path / "fleet"
    assert main(["merge", str(tmp_path / "shard"), "--out", str(out)]) == 1
    for name in ("fleet-summary.html", "fleet-junit.xml"):
        text = (out / name).read_text()
        assert "PWNED" in text, name
        assert not [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f], name
        assert not [line for line in text.splitlines() if line.lstrip().startswith("::")], name
        assert "##vso[" not in text, name


@pytest.mark.parametrize(("damage", "said"), [
    (lambda s, h: s["hosts"].update({h: "x"}), "is str, not an object"),
    (lambda s, h: s["hosts"][h].update(layers=[1]), "'layers' is list"),
    (lambda s, h: s["hosts"][h].update(services=3), "'services' is int"),
    (lambda s, h: s["hosts"][h].update(metrics={"perf:dflash.output_throughput": "fast"}), "a metric is not a number"),
    (lambda s, h: s["hosts"][h].update(last_good="yesterday"), "'last_good' is str"),
    (lambda s, h: s.update(run_ids=[1, 2]), "'run_ids' must be a list of strings"),
], ids=["entry-str", "layers-list", "services-int", "metric-str", "last-good-str", "run-ids-ints"])
def test_a_damaged_previous_summary_is_one_line_not_a_crash(shards: Path, tmp_path: Path, damage: Any, said: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A previous summary with the right schema but host entries of the wrong shape (edited, or written by a
    broken tool) once crashed the trend with a traceback and exit 1, which reads as "a host failed"."""
    assert main(["merge", str(shards), "--out", str(tmp_path / "first"), "-q"]) in (0, 1)
    summary = json.loads((tmp_path / "first" / "fleet-summary.json").read_text())
    damage(summary, next(iter(summary["hosts"])))
    (tmp_path / "prev.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert main(["merge", str(shards), "--out", str(tmp_path / "out"), "--previous", str(tmp_path / "prev.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'prev.json'}: not a fleet summary (" in err and said in err, err
    assert not (tmp_path / "out").exists()
