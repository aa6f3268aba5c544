"""Where speculation stops paying, across a fleet and over nights (fleet/sweeps.py): the summary's per-host
crossover and highest level within the SLOs (or "not swept"), in the JSON, the HTML matrix and the trend;
verdicts written by the real VerdictBuilder, carrying the perf layer's sweep numbers
(layers/perf/sweep/book.py::sweep_metrics), merged by the real CLI."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from support.fleet_helpers import GREEN, make_verdict

from pytest_dflash.cli import main
from pytest_dflash.fleet.sweeps import speculation_lines, sweep_entry
from pytest_dflash.fleet.values import iso

DAY = 86400.0
T0 = 1796000000.0
LEVELS = (1, 4, 8, 16, 32, 64)
SERVICES = {"dflash": {"algorithm": "DFLASH", "version": "0.5.17"},
            "none": {"algorithm": "NONE", "version": "0.5.17"}}


def sweep_metrics(crossover: int | None, *, within: int | None = 4,
                  levels: tuple[int, ...] = LEVELS) -> dict[str, float]:
    """The verdict's numbers of a sweep of dflash and none (as sweep_metrics writes them): DFLASH 1.5x NONE
    below the crossover, 0.7x from it; every level up to `within` within the SLOs."""
    out: dict[str, float] = {}
    for level in levels:
        slow = crossover is not None and level >= crossover
        for service, tok in (("none", 100.0 * level), ("dflash", (70.0 if slow else 150.0) * level)):
            out[f"perf.{service}.sweep.c{level}.output_tok_s"] = tok
            out[f"perf.{service}.sweep.c{level}.slo_pass"] = 1.0 if within is not None and level <= within else 0.0
        ratio = 0.7 if slow else 1.5
        out[f"perf.dflash.sweep.c{level}.speedup_vs_none"] = ratio
        out[f"perf.dflash.sweep.c{level}.speedup_vs_none.lower"] = ratio - 0.1
        out[f"perf.dflash.sweep.c{level}.speedup_vs_none.upper"] = ratio + 0.1
    if crossover is not None:
        out["perf.dflash.sweep.crossover_vs_none"] = float(crossover)
    out["perf.dflash.sweep.crossover_vs_none.pass"] = 0.0  # a gate's flag is not the crossover level
    return out


def _merge(inputs: Path, out: Path) -> dict[str, Any]:
    main(["merge", str(inputs), "--out", str(out), "-q"])
    data: dict[str, Any] = json.loads((out / "fleet-summary.json").read_text())
    return data


def test_the_summary_says_per_host_where_speculation_stops_paying_or_not_swept(tmp_path: Path) -> None:
    night = tmp_path / "n1"
    make_verdict(night, "gpu-a", GREEN, services=SERVICES, metrics=sweep_metrics(8))
    make_verdict(night, "gpu-b", GREEN, services=SERVICES, metrics=sweep_metrics(None, within=None))
    make_verdict(night, "gpu-c", GREEN, services=SERVICES, metrics={"perf.dflash.output_throughput": 500.0})
    summary = _merge(night, tmp_path / "fleet")
    hosts = summary["hosts"]
    assert hosts["gpu-a"]["sweep"]["dflash"] == {"levels": list(LEVELS), "slo": True, "max_within_slo": 4,
                                                 "versus": {"none": {"crossover": 8, "up_to": 64}}}
    assert hosts["gpu-c"]["sweep"] == {}
    assert speculation_lines(hosts["gpu-a"]) == [
        "dflash: slower than none from concurrency 8; within SLO up to concurrency 4"]
    assert speculation_lines(hosts["gpu-b"]) == [
        "dflash: not slower than none up to concurrency 64; no level within SLO"]
    assert speculation_lines(hosts["gpu-c"]) == ["dflash: not swept"]  # the plain service is not listed
    page = html.unescape((tmp_path / "fleet" / "fleet-summary.html").read_text())
    assert "<th>where speculation stops paying</th>" in page
    assert "dflash: slower than none from concurrency 8; within SLO up to concurrency 4" in page
    assert "dflash: not swept" in page


def test_a_sweep_without_slos_says_so() -> None:
    metrics = {k: v for k, v in sweep_metrics(16).items() if not k.endswith("slo_pass")}
    entry = {"services": SERVICES, "sweep": sweep_entry(metrics)}
    assert speculation_lines(entry) == ["dflash: slower than none from concurrency 16; no SLO"]


def test_a_crossover_that_moved_is_called_out_in_the_trend_with_the_good_runs_before(
        tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "fleet"
    for night, crossover in enumerate((32, 32, 8)):
        directory = tmp_path / f"n{night}"
        make_verdict(directory, "gpu-a", GREEN, run_id=f"n{night}", finished=T0 + night * DAY,
                     services=SERVICES, metrics=sweep_metrics(crossover))
        make_verdict(directory, "gpu-b", GREEN, run_id=f"n{night}", finished=T0 + night * DAY,
                     services=SERVICES, metrics=sweep_metrics(None))  # pays all the way, every night
        capsys.readouterr()
        main(["merge", str(directory), "--out", str(out)])
    summary = json.loads((out / "fleet-summary.json").read_text())
    (change,) = summary["trend"]["crossover"]
    since = iso(T0 + DAY)[:10]
    assert change == {"host": "gpu-a", "service": "dflash", "versus": "none", "previous": "32", "current": "8",
                      "since": iso(T0 + DAY), "direction": "worse",
                      "history": [{"finished": iso(T0), "crossover": "32"},
                                  {"finished": iso(T0 + DAY), "crossover": "32"}]}
    line = f"gpu-a crossover dflash vs none: 32 -> 8 since {since}"
    assert line in capsys.readouterr().out  # the merge's terminal lines
    page = html.unescape((out / "fleet-summary.html").read_text())
    assert line in page and "(good runs: 32, 32)" in page


def test_speculation_paying_further_is_a_better_change_and_none_to_a_level_is_worse(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    for night, crossover in enumerate((None, 16, None)):
        directory = tmp_path / f"n{night}"
        make_verdict(directory, "gpu-a", GREEN, run_id=f"n{night}", finished=T0 + night * DAY,
                     services=SERVICES, metrics=sweep_metrics(crossover))
        summary = _merge(directory, out)
        if night == 1:
            (change,) = summary["trend"]["crossover"]
            assert (change["previous"], change["current"], change["direction"]) == ("none up to 64", "16", "worse")
    (change,) = summary["trend"]["crossover"]
    assert (change["previous"], change["current"], change["direction"]) == ("16", "none up to 64", "better")
