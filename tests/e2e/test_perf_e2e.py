"""`pytest --host local suites/perf` (hosts/local.toml, copied as host "perf-local"), through the real plugin and suite.

A clean local host passes its floors (and --update-baseline records it); the same profile with
`slow-decode` on DFLASH fails the throughput floor, the speed-up floor and the baseline, each with the measured
value, the bound and the threshold; a too-short run is INCONCLUSIVE, not a pass.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from e2e_helpers import ROOT
from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.config.targets import file_name
from pytest_dflash.layers.perf.baseline import load_baseline

LOCAL = ROOT / "hosts" / "local.toml"
HOST = "perf-local"
SLOW_DECODE = 8  # DFLASH ~520 -> ~65 tok/s: far under its floor of 150, even on a quiet machine


def local_profile(directory: Path, *, slow_dflash: int | None = None, max_loop_lag_ms: float | None = None) -> Path:
    """hosts/local.toml as shipped (its [perf] and [floors] tables), optionally with slow-decode on DFLASH.

    Named 'perf-local': the same profile as --host local, without waiting for the host lock of other
    self-tests that run --host local in parallel (CI runs -n 2). Without its load sweep: the sweep tests are then
    skipped as not applicable (tests/e2e/test_sweep_e2e.py judges sweeps), which keeps these runs short.
    """
    text = LOCAL.read_text()
    assert text.count("sweep = [2, 4]\n") == 1
    text = text.replace("sweep = [2, 4]\n", "")
    if slow_dflash is not None:
        anchor = '"--speculative-algorithm", "DFLASH",'
        assert text.count(anchor) == 1
        text = text.replace(anchor, f'{anchor} "--inject", "slow-decode={slow_dflash}",')
    if max_loop_lag_ms is not None:
        assert text.count("max_loop_lag_ms = 50\n") == 1
        text = text.replace("max_loop_lag_ms = 50\n", f"max_loop_lag_ms = {max_loop_lag_ms}\n")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{HOST}.toml"  # its baselines: <baseline dir>/perf-local/<service>.json
    path.write_text(text)
    return path


def floors(name: str) -> dict[str, float]:
    import tomllib

    table: dict[str, float] = tomllib.loads(LOCAL.read_text())["floors"][name]
    return table


@pytest.mark.heavy
def test_clean_local_passes_and_records_baselines_then_slow_decode_fails_with_the_evidence(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    baselines = tmp_path / "baselines"
    html = tmp_path / "perf.html"
    clean = run_suite("perf", "--host", str(local_profile(tmp_path / "clean")), "--update-baseline", f"--baseline-dir={baselines}", f"--html={html}")
    assert_no_crash(clean)
    clean.assert_outcomes(passed=10, skipped=9)  # skipped: NONE has no speed-up floor; 8 sweep tests, no sweep
    clean.stdout.fnmatch_lines([
        "*dflash perf*",
        f"{HOST}: generate, concurrency 1, 32+32 tokens, 30 requests and 60 s",
        "    dflash (DFLASH): * tok/s [[]*, *[]], * req/s, TTFT p50/p99 */* ms, ITL p99 * ms, e2e p50/p99 */* ms, "
        "accept length * (client; server-reported *)",
        "        errors PASS, output_tok_s PASS, itl_p99_ms PASS, ttft_p50_ms PASS, accept_length PASS, "
        "speedup_vs_none PASS",
        "    speed-up (output tok/s, same load, 95% bounds): *ddtree/dflash *x [[]*[]] (accept length * vs *)*",
        f"{HOST}: PASS*perf:passed*",  # one suite is a declared scope (docs/gating.md)
    ])
    data = verdict(run_suite.reports, HOST)
    metrics = data["metrics"]
    # suites/perf alone is a declared scope (docs/gating.md): its checks pass, so the host passes, scope named
    assert data["verdict"] == "pass" and data["tests_verdict"] == "pass"
    assert data["layers"]["perf"]["outcome"] == "passed"
    for service in ("none", "dflash", "ddtree"):
        assert metrics[f"perf.{service}.output_throughput"] >= floors(service)["output_tok_s"]
        assert metrics[f"perf.{service}.output_tok_s.pass"] == 1.0
        # the interval the fleet trend judges a throughput change by (fleet/trend.py)
        assert (metrics[f"perf.{service}.output_throughput.lower"] < metrics[f"perf.{service}.output_throughput"]
                < metrics[f"perf.{service}.output_throughput.upper"])
        doc = json.loads((run_suite.reports / "perf" / HOST / f"{service}.json").read_text())
        assert {"output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "accept_length"} <= set(doc)
        assert doc["completed"] == 30 and doc["dflash_perf"]["service"] == service
        recorded = load_baseline(baselines / HOST / f"{service}.json")
        assert len(recorded.result.measured) == 30
        assert recorded.result.metrics["output_throughput"] == pytest.approx(doc["output_throughput"])
    assert metrics["perf.ddtree.speedup_vs_none"] >= floors("ddtree")["speedup"]
    assert 0.5 < metrics["perf.ddtree.speedup_vs_dflash"] < 2.0
    assert metrics["perf.dflash.accept_length"] > 3 and metrics["perf.dflash.server_accept_length"] > 3
    page = html.read_text()
    for title in ("Latency CDF", "Output tokens/s over time", "Accept length per request"):
        assert title in page, title

    junit, slow_html = tmp_path / "slow.xml", tmp_path / "slow.html"
    slow = run_suite("perf", "--host", str(local_profile(tmp_path / "slow", slow_dflash=SLOW_DECODE)),
                     "-k", "not ddtree", f"--baseline-dir={baselines}", f"--junitxml={junit}", f"--html={slow_html}")
    assert_no_crash(slow)
    slow.assert_outcomes(failed=3, passed=3, skipped=6, deselected=7)  # DFLASH: floors, speed-up, baseline fail; accept length holds
    floor = floors("dflash")["output_tok_s"]
    slow.stdout.fnmatch_lines([
        f"E * {HOST}/dflash: output_tok_s: FAIL — * tok/s, 95% upper bound * tok/s < floor {floor:g} tok/s "
        "(n=30 requests)",
        f"E * {HOST}/dflash: speed-up dflash (DFLASH) / none (NONE): FAIL — *x, 95% upper bound *x < floor 2x*",
        f"E * {HOST}/dflash: output_tok_s vs baseline: FAIL — *x < floor 0.5x (n=30 requests) [[]current * tok/s vs "
        "baseline *; allowed regression 50%[]]; output_tok_s * -> * tok/s (-*%) since the baseline recorded *",
    ], consecutive=False)
    text = slow.stdout.str()
    measured = re.search(r"output_tok_s: FAIL — ([\d.]+) tok/s, 95% upper bound ([\d.]+) tok/s", text)
    assert measured is not None
    point, bound = float(measured.group(1)), float(measured.group(2))
    assert point < bound < floor
    data = verdict(run_suite.reports, HOST)
    assert data["verdict"] == "fail" and data["layers"]["perf"]["outcome"] == "failed"
    assert data["metrics"]["perf.dflash.output_tok_s.pass"] == 0.0
    assert data["metrics"]["perf.dflash.output_tok_s.bound"] == pytest.approx(bound, rel=1e-3)
    assert data["metrics"]["perf.none.output_tok_s.pass"] == 1.0
    assert "output_tok_s: FAIL" in data["failures"][0]["message"]
    # JUnit carries the measurements as flat properties (docs/gating.md), never a threshold
    properties = {p.get("name"): p.get("value") for case in ET.parse(junit).getroot().iter("testcase")
                  if "dflash" in case.get("name", "") for p in case.iter("property")}
    assert float(properties["dflash.perf.dflash.output_tok_s"]) == pytest.approx(
        data["metrics"]["perf.dflash.output_throughput"], rel=1e-3)
    assert {"dflash.perf.dflash.ttft_p99_ms", "dflash.perf.dflash.itl_p99_ms", "dflash.perf.dflash.accept_length",
            "dflash.perf.dflash.speedup_vs_none"} <= set(properties)
    assert not [name for name in properties if name.startswith("dflash.perf.") and name.endswith((".bound", ".pass"))]
    # the failed floor is drawn on the plot, marked, and the plot's mean is the headline's number
    page = slow_html.read_text()
    assert f"floor output_tok_s {floor:g} FAILED" in page
    headline = re.search(r"perf-local/dflash \(DFLASH\): ([\d.]+) output tok/s", page)
    assert headline is not None and f"mean {headline.group(1)} tok/s (the headline)" in page
    # the baseline is not replaced by a bad run
    assert load_baseline(baselines / HOST / "dflash.json").result.metrics["output_throughput"] > floor


def test_a_too_short_run_is_inconclusive_and_fails(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_suite("perf", "--host", str(local_profile(tmp_path)), "-k", "floors and dflash", "--perf-requests", "8")
    assert_no_crash(result)
    result.assert_outcomes(failed=1, deselected=18)
    result.stdout.fnmatch_lines([
        f"E * {HOST}/dflash: output_tok_s: INCONCLUSIVE — * tok/s from too short a run (n=8 requests; at least 20 "
        "units are needed to judge); about 12 more requests would decide",
        "E * INCONCLUSIVE is not a pass: the test fails and a --gate with perf does not pass. Measure longer: "
        "--perf-requests 20 *",
    ], consecutive=False)
    data = verdict(run_suite.reports, HOST)
    assert data["layers"]["perf"]["outcome"] == "failed"
    assert data["metrics"]["perf.dflash.output_tok_s.inconclusive"] == 1.0
    assert data["metrics"]["perf.dflash.output_tok_s.pass"] == 0.0


def test_a_saturated_client_refuses_to_judge_and_says_so(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A lag threshold no event loop meets: every run counts as saturated, is measured again once, then refused.
    # Accept length is the server's count, so it is still judged (and passes) on the same run.
    result = run_suite("perf", "--host", str(local_profile(tmp_path, max_loop_lag_ms=0.001)), "-k",
                       "(floors or accept_length) and dflash", "--perf-requests", "20")
    assert_no_crash(result)
    result.assert_outcomes(failed=1, passed=2, deselected=16)
    result.stdout.fnmatch_lines([
        "*perf-local/dflash: the load client was saturated (event-loop lag p99 * ms > 0.001 ms*): measuring again",
        f"E * {HOST}/dflash: output_tok_s: REFUSED — no judgement: the load client was saturated (event-loop lag "
        f"p99 * ms > 0.001 ms*) in 2 of 2 run(s): its numbers measure the client, not {HOST}/dflash",
        "E * REFUSED: the load client was the bottleneck, so nothing was judged.*",
    ], consecutive=False)
    data = verdict(run_suite.reports, HOST)
    assert data["layers"]["perf"]["outcome"] == "failed"
    assert data["metrics"]["perf.dflash.client_saturated"] == 1.0
    assert data["metrics"]["perf.dflash.output_tok_s.pass"] == 0.0


def test_a_baseline_under_the_old_lossy_host_folder_is_still_compared_and_recorded_anew(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    """A host named `perf_local` records its baselines in `perf%5Flocal/` now (injective: `perf:local` is
    `perf_local/`). One recorded before in `perf_local/` (the lossy name) is still compared, with a note naming
    both places (never skipped as "no baseline", which would hide a regression); --update-baseline records it
    under the new name."""
    profile = local_profile(tmp_path / "p").read_text()
    path = tmp_path / "p" / "perf_local.toml"
    path.write_text(profile)
    baselines = tmp_path / "baselines"
    recorded = run_suite("perf", "--host", str(path), "-k", "baseline and dflash and not ddtree", "--update-baseline",
                         f"--baseline-dir={baselines}")
    assert_no_crash(recorded)
    recorded.assert_outcomes(passed=1, deselected=18)
    new = baselines / "perf%5Flocal" / "dflash.json"
    assert new.is_file() and (run_suite.reports / "perf" / "perf%5Flocal" / "dflash.json").is_file()
    old = baselines / "perf_local" / "dflash.json"
    old.parent.mkdir()
    new.rename(old)  # where an earlier release recorded it
    compared = run_suite("perf", "--host", str(path), "-k", "baseline and dflash and not ddtree",
                         f"--baseline-dir={baselines}")
    assert_no_crash(compared)
    compared.assert_outcomes(passed=1, deselected=18)
    notes = verdict(run_suite.reports, file_name("perf_local"))["notes"]  # perf%5Flocal.verdict.json
    assert any(f"perf baseline read from {old}" in note and str(new) in note for note in notes), notes
