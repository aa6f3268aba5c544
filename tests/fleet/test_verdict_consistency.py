"""merge refuses a verdict file that contradicts itself (issue 24, item 2): each contradiction, on a verdict the
real VerdictBuilder wrote and then edited the way a broken tool or a hand would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.fleet_helpers import BROKEN, GREEN, make_verdict

from pytest_dflash.cli import main
from pytest_dflash.fleet.verdicts import inconsistency


def _edit(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("start", "changes", "said"), [
    (BROKEN, {"verdict": "pass"}, "'verdict' is 'pass' but layer 'service' failed"),
    (GREEN, {"failures": [{"test": "t", "message": "m"}]}, "it lists failed or blocked tests"),
    (GREEN, {"exit_code": 2}, "the run exited 2"),
    (GREEN, {"exit_code": None}, "'exit_code' is null"),
    (GREEN, {"partial": ["-k 'x'"]}, "'complete' is True"),
    (GREEN, {"partial": ["-k 'x'"], "complete": False}, "'verdict' is 'pass' but 'partial' says"),
    (GREEN, {"interrupted": "killed"}, "'verdict' is 'pass' but 'interrupted' is 'killed'"),
    (GREEN, {"verdict": "fail"}, "no layer failed"),
    (BROKEN, {"exit_code": 0}, "exited 0 without a gate that passed"),
    (GREEN, {"verdict": "partial"}, "'partial' gives no reason"),
    (GREEN, {"layers": {"service": {"outcome": "passed", "passed": 0, "failed": 1}}}, "its counts"),
    (GREEN, {"layers": {}}, "'verdict' is 'pass' but no layer passed"),
    (GREEN, {"layers": {"host": {"outcome": "skipped", "skipped": 3}}}, "'verdict' is 'pass' but no layer passed"),
    (GREEN, {"exit_code": True}, "the run exited True"),
    (GREEN, {"layers": {"host": {"outcome": "passed", "passed": "1", "failed": "2"}}}, "not whole numbers"),
], ids=["pass-with-failed-layer", "pass-with-failures", "pass-exit-2", "pass-never-finished", "complete-but-partial",
        "pass-but-partial", "pass-but-interrupted", "fail-without-failure", "fail-exit-0", "partial-no-reason",
        "layer-counts", "pass-without-layers", "pass-all-skipped", "pass-exit-true", "layer-counts-strings"])
def test_merge_refuses_a_verdict_that_contradicts_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         start: dict[str, str], changes: dict[str, Any],
                                                         said: str) -> None:
    make_verdict(tmp_path / "in", "gpu-a", GREEN)
    path = make_verdict(tmp_path / "in", "gpu-b", start)
    assert inconsistency(json.loads(path.read_text())) is None  # as the plugin wrote it: consistent
    _edit(path, **changes)
    assert main(["merge", str(tmp_path / "in"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: inconsistent verdict, refused: " in err and said in err, err
    assert len(err.strip().splitlines()) == 1  # one line, naming the file
    assert not (tmp_path / "out" / "fleet-summary.json").exists()


def test_merge_names_a_host_a_run_named_but_no_shard_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_verdict(tmp_path / "shard-1", "gpu-a", GREEN)
    _edit(path, run={"hosts": ["gpu-a", "gpu-b"], "shard": "1/2"})
    assert main(["merge", str(tmp_path / "shard-1"), "--out", str(tmp_path / "out")]) == 1
    summary = json.loads((tmp_path / "out" / "fleet-summary.json").read_text())
    assert summary["hosts"]["gpu-b"]["verdict"] == "interrupted"
    assert "no verdict for this host" in summary["hosts"]["gpu-b"]["interrupted"]
    assert summary["totals"]["pass"] == 1 and summary["totals"]["hosts"] == 2
    # --exclude takes it out on purpose: then the one that ran is the whole fleet
    assert main(["merge", str(tmp_path / "shard-1"), "--out", str(tmp_path / "out2"), "--exclude", "gpu-b"]) == 0
