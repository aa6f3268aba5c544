"""Trend vs the previous summary, failing-since, and "what changed" vs each host's last good verdict."""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.fleet_helpers import BROKEN, GREEN, SERVICES, make_verdict

from pytest_dflash.cli import main
from pytest_dflash.fleet import outputs as fleet_outputs
from pytest_dflash.fleet import summary as fleet
from pytest_dflash.fleet import trend
from pytest_dflash.fleet import verdicts as fleet_verdicts
from pytest_dflash.fleet.values import iso

DAY = 86400.0
T0 = 1796000000.0
ENV_GOOD = {"env": {"driver": "580.65.06", "torch_cuda": "12.8", "python": "3.12.3",
                    "packages": {"torch": "2.9.1", "sglang": "0.5.17", "flashinfer-python": "0.5.2"},
                    "units": {"sglang-dflash.service": {"exec_start_flags": "--speculative-num-draft-tokens 8"}},
                    "jit_cache": {"flashinfer": {"modules": 12}}}}


def _merge(inputs: Path, out: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    main(["merge", str(inputs), "--out", str(out), "-q", *extra])
    data: dict = json.loads((out / "fleet-summary.json").read_text())  # type: ignore[type-arg]
    return data


def test_three_nights_new_failure_still_failing_fixed_disappeared(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    night1 = tmp_path / "n1"
    for host in ("gpu-a", "gpu-b", "gpu-c"):
        make_verdict(night1, host, GREEN, run_id="n1", finished=T0,
                     metrics={"perf": {"dflash": {"output_throughput": 800.0, "p99_ttft_ms": 50.0}}})
    first = _merge(night1, out)
    assert first["trend"] is None and first["totals"]["pass"] == 3
    night2 = tmp_path / "n2"
    make_verdict(night2, "gpu-a", GREEN, run_id="n2", finished=T0 + DAY,
                 metrics={"perf": {"dflash": {"output_throughput": 600.0, "p99_ttft_ms": 80.0}}})   # slower, still passes
    make_verdict(night2, "gpu-b", BROKEN, run_id="n2", finished=T0 + DAY)
    make_verdict(night2, "gpu-d", GREEN, run_id="n2", finished=T0 + DAY)             # new host; gpu-c is gone
    second = _merge(night2, out)  # --previous defaults to the summary already in --out
    trend = second["trend"]
    assert trend["previous"]["run_ids"] == ["n1"]
    assert trend["new_failures"] == [{"host": "gpu-b", "was": "pass", "layers": ["service", "generation"],
                                      "diagnosis": ["flashinfer-sm12x-nvcc"]}]
    assert trend["fixed"] == [] and trend["disappeared"] == ["gpu-c"] and trend["new_hosts"] == ["gpu-d"]
    perf = {(p["host"], p["metric"]): p for p in trend["perf"]}
    tok = perf[("gpu-a", "perf.dflash.output_throughput")]
    assert (tok["previous"], tok["current"], tok["pct"], tok["regression"]) == (800.0, 600.0, -25.0, False)
    assert tok["rule"] == "not judged: 1 good run on record, 3 needed", "one earlier run is no spread to judge by"
    ttft = perf[("gpu-a", "perf.dflash.p99_ttft_ms")]
    assert ttft["pct"] == 60.0 and ttft["significant"] and not ttft["regression"]
    assert (tok["direction"], ttft["direction"]) == ("worse", "worse")
    gpu_b = second["hosts"]["gpu-b"]
    assert gpu_b["failing_since"] == iso(T0 + DAY)
    assert gpu_b["last_good"]["run_id"] == "n1"
    assert gpu_b["changed"]["basis"] == "services" and gpu_b["changed"]["count"] == 0
    night3 = tmp_path / "n3"
    make_verdict(night3, "gpu-a", GREEN, run_id="n3", finished=T0 + 2 * DAY,
                 metrics={"perf": {"dflash": {"output_throughput": 805.0, "p99_ttft_ms": 50.0}}})
    make_verdict(night3, "gpu-b", BROKEN, run_id="n3", finished=T0 + 2 * DAY)
    make_verdict(night3, "gpu-d", BROKEN, run_id="n3", finished=T0 + 2 * DAY)
    third = _merge(night3, out)
    trend = third["trend"]
    assert [f["host"] for f in trend["new_failures"]] == ["gpu-d"] and trend["still_failing"] == ["gpu-b"]
    assert third["hosts"]["gpu-b"]["failing_since"] == iso(T0 + DAY), "the streak started on night 2"
    assert third["hosts"]["gpu-d"]["failing_since"] == iso(T0 + 2 * DAY)
    night4 = tmp_path / "n4"
    make_verdict(night4, "gpu-b", GREEN, run_id="n4", finished=T0 + 3 * DAY)
    fourth = _merge(night4, out, "--exclude", "gpu-d")
    assert fourth["trend"]["fixed"] == [{"host": "gpu-b", "layers": ["service", "generation"]}]
    assert fourth["trend"]["disappeared"] == ["gpu-a"], "an excluded host did not disappear"
    assert fourth["hosts"]["gpu-b"]["failing_since"] is None
    page = (out / "fleet-summary.html").read_text()
    assert "fixed (1)" in page and "disappeared (1)" in page


def test_what_changed_uses_the_env_snapshot_when_both_have_one(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    make_verdict(tmp_path / "good", "gpu-a", GREEN, run_id="good", finished=T0, facts=ENV_GOOD)
    _merge(tmp_path / "good", out)
    env = json.loads(json.dumps(ENV_GOOD))
    env["env"]["driver"] = "575.51.03"
    env["env"]["packages"]["torch"] = "2.10.0"
    env["env"]["packages"]["soundfile"] = "0.13.1"
    del env["env"]["packages"]["flashinfer-python"]
    env["env"]["units"]["sglang-dflash.service"]["exec_start_flags"] = "--speculative-num-draft-tokens 16"
    env["env"]["jit_cache"]["flashinfer"]["modules"] = 0
    services = {"dflash": {**SERVICES["dflash"], "version": "0.5.18", "ready": {"total_s": 3.0}}}
    make_verdict(tmp_path / "bad", "gpu-a", BROKEN, run_id="bad", finished=T0 + DAY, facts=env, services=services)
    summary = _merge(tmp_path / "bad", out)
    changed = summary["hosts"]["gpu-a"]["changed"]
    assert changed["basis"] == "facts" and changed["since"]["run_id"] == "good"
    got = {(c["category"], c["key"]): (c["before"], c["after"]) for c in changed["changes"]}
    assert got == {
        ("driver", "facts.env.driver"): ("580.65.06", "575.51.03"),
        ("packages", "facts.env.packages.torch"): ("2.9.1", "2.10.0"),
        ("packages", "facts.env.packages.soundfile"): (None, "0.13.1"),
        ("packages", "facts.env.packages.flashinfer-python"): ("0.5.2", None),
        ("unit", "facts.env.units.sglang-dflash.service.exec_start_flags"): (
            "--speculative-num-draft-tokens 8", "--speculative-num-draft-tokens 16"),
        ("jit-cache", "facts.env.jit_cache.flashinfer.modules"): (12, 0),
        ("service", "services.dflash.version"): ("0.5.17", "0.5.18"),  # readiness time is not a change
    }
    lines = fleet_outputs.headline(summary)
    assert any(line.startswith("gpu-a: failing since") and "changed since last good run good" in line
               for line in lines), lines
    page = (out / "fleet-summary.html").read_text()
    assert "What changed since the last good run good" in page and "facts.env.packages.torch" in page


def test_what_changed_falls_back_to_services_and_says_why(tmp_path: Path) -> None:
    history = fleet_verdicts.History(tmp_path / "history")
    good = tmp_path / "good"
    make_verdict(good, "gpu-a", GREEN, run_id="good", finished=T0,
                 services={"dflash": {**SERVICES["dflash"], "provisioned": True, "url": "http://127.0.0.1:41000"}})
    history.record([fleet_verdicts.LoadedVerdict(p, fleet_verdicts.read_verdict(p)) for p in good.glob("*.json")])
    bad = make_verdict(tmp_path / "bad", "gpu-a", BROKEN, run_id="bad", finished=T0 + DAY, facts=ENV_GOOD,
                       services={"dflash": {**SERVICES["dflash"], "algorithm": "DDTREE", "provisioned": True,
                                            "url": "http://127.0.0.1:42000"}})
    summary = fleet.build_summary([fleet_verdicts.LoadedVerdict(bad, fleet_verdicts.read_verdict(bad))], history=history)
    changed = summary["hosts"]["gpu-a"]["changed"]
    assert changed["basis"] == "services" and "last good verdict has no env/facts snapshot" in changed["note"]
    assert changed["changes"] == [{"category": "service", "key": "services.dflash.algorithm",
                                   "before": "DFLASH", "after": "DDTREE"}], "a provisioned service's port is noise"


def test_history_keeps_the_newest_good_verdict_only(tmp_path: Path) -> None:
    history = fleet_verdicts.History(tmp_path / "history")

    def loaded(directory: Path, run: str, when: float, outcomes: dict[str, str]) -> fleet_verdicts.LoadedVerdict:
        path = make_verdict(directory, "gpu-a", outcomes, run_id=run, finished=when)
        return fleet_verdicts.LoadedVerdict(path, fleet_verdicts.read_verdict(path))

    assert history.record([loaded(tmp_path / "2", "new", T0 + DAY, GREEN)]) == [history.path("gpu-a")]
    assert history.record([loaded(tmp_path / "1", "old", T0, GREEN)]) == [], "a late old artifact"
    assert history.record([loaded(tmp_path / "3", "bad", T0 + 2 * DAY, BROKEN)]) == [], "only good verdicts"
    assert history.record([loaded(tmp_path / "2", "new", T0 + DAY, GREEN)]) == [], "the same one again"
    assert (history.last_good("gpu-a") or {})["run_id"] == "new"
    history.path("gpu-a").write_text("{damaged")
    assert history.last_good("gpu-a") is None


def test_previous_summary_from_an_older_layer_set_still_compares(tmp_path: Path) -> None:
    make_verdict(tmp_path / "in", "gpu-a", BROKEN)
    previous = {"schema": fleet.SUMMARY_SCHEMA, "generated": "yesterday", "run_ids": ["x"],
                "hosts": {"gpu-a": {"verdict": "pass", "layers": {"host": "passed", "service": "passed"},
                                    "services": {}, "metrics": {}}}}
    (tmp_path / "prev.json").write_text(json.dumps(previous))
    summary = _merge(tmp_path / "in", tmp_path / "out", "--previous", str(tmp_path / "prev.json"))
    assert summary["trend"]["new_failures"][0]["was"] == "pass"
    assert summary["trend"]["perf"] == []


def test_direction_of_perf_numbers_the_perf_layer_writes() -> None:
    worse_when_higher = ["perf.dflash.median_ttft_ms", "perf.dflash.p99_itl_ms", "perf.dflash.mean_tpot_ms",
                         "perf.dflash.p99_e2e_latency_ms", "perf.dflash.failed", "service:dflash.ready_s",
                         "perf.dflash.client_saturated"]
    worse_when_lower = ["perf.dflash.output_throughput", "perf.dflash.request_throughput", "perf.dflash.accept_length",
                        "perf.ddtree.speedup_vs_dflash", "perf.dflash.output_tok_s.pass", "service:dflash.accept_length"]
    assert all(trend.lower_is_better(m) for m in worse_when_higher)
    assert not any(trend.lower_is_better(m) for m in worse_when_lower)
    deltas = trend.perf_deltas({"perf.dflash.failed": 0.0, "perf.dflash.output_throughput": 100.0},
                               {"perf.dflash.failed": 3.0, "perf.dflash.output_throughput": 103.0}, 5.0,
                               [{"perf.dflash.failed": 0.0, "perf.dflash.output_throughput": 100.0}] * 3)
    assert deltas["perf.dflash.failed"]["regression"], "failed requests where good runs had none"
    assert deltas["perf.dflash.failed"]["rule"] == "outside the last 3 good runs' range 0-0 by > 25%"
    assert deltas["perf.dflash.failed"]["regression"] and deltas["perf.dflash.failed"]["pct"] is None
    assert not deltas["perf.dflash.output_throughput"]["significant"]


# ---- signal vs noise (issue 26) ----------------------------------------------------------------------------

# Readiness times of one host over nine good runs: the spread `--host local suites/smoke` shows run to run
# (3.975 -> 4.495 was printed as a +13.1% regression before).
NOISY_READY = [3.975, 4.495, 3.62, 4.31, 3.81, 4.52, 3.70, 4.05, 4.60]


def _night(tmp_path: Path, night: int, ready_s: float, metrics: dict | None = None,  # type: ignore[type-arg]
           outcomes: dict[str, str] = GREEN) -> Path:
    folder = tmp_path / f"n{night}"
    services = {"dflash": {**SERVICES["dflash"], "ready": {"total_s": ready_s}}}
    make_verdict(folder, "gpu-a", outcomes, run_id=f"n{night}", finished=T0 + night * DAY, services=services,
                 metrics=metrics or {})
    return folder


def test_noisy_readiness_is_never_a_regression_but_a_doubled_one_is(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    for night, ready in enumerate(NOISY_READY):
        summary = _merge(_night(tmp_path, night, ready), out)
        if summary["trend"] is None:
            continue
        assert not [p for p in summary["trend"]["perf"] if p["regression"]], (night, summary["trend"]["perf"])
        assert not any(line.startswith("perf regressions") for line in fleet_outputs.headline(summary))
    runs = json.loads((out / "history" / "gpu-a" / trend.GOOD_RUNS).read_text())["runs"]
    assert [r["numbers"]["service:dflash.ready_s"] for r in runs] == NOISY_READY
    doubled = _merge(_night(tmp_path, 20, 9.2), out)
    (change,) = [p for p in doubled["trend"]["perf"] if p["regression"]]
    assert (change["metric"], change["previous"], change["current"]) == ("service:dflash.ready_s", 4.6, 9.2)
    line = next(line for line in fleet_outputs.headline(doubled) if line.startswith("perf regressions"))
    assert line == ("perf regressions: gpu-a service:dflash.ready_s 4.6 -> 9.2 (+100.0%), outside the last 5 good "
                    "runs' range 3.7-4.6 by > 25%")
    assert html.escape("outside the last 5 good runs' range 3.7-4.6 by > 25%") in (out / "fleet-summary.html").read_text()


def test_nothing_is_flagged_before_three_good_runs_are_on_record(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    _merge(_night(tmp_path, 0, 4.0), out)
    second = _merge(_night(tmp_path, 1, 12.0), out)  # tripled, but one earlier run is no spread
    (change,) = second["trend"]["perf"]
    assert not change["regression"] and change["rule"] == "not judged: 1 good run on record, 3 needed"
    _merge(_night(tmp_path, 2, 4.1), out)  # the tripled run was good too: it is part of the spread now
    fourth = _merge(_night(tmp_path, 3, 13.0), out)
    assert not [p for p in fourth["trend"]["perf"] if p["regression"]], "within 4.0-12.0 + 25%"


def test_a_failing_run_is_not_part_of_the_spread(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    for night, ready in enumerate([4.0, 4.2, 3.9]):
        _merge(_night(tmp_path, night, ready), out)
    _merge(_night(tmp_path, 3, 30.0, outcomes=BROKEN), out)
    runs = json.loads((out / "history" / "gpu-a" / trend.GOOD_RUNS).read_text())["runs"]
    assert [r["run_id"] for r in runs] == ["n0", "n1", "n2"]
    after = _merge(_night(tmp_path, 4, 8.0), out)
    assert [p["metric"] for p in after["trend"]["perf"] if p["regression"]] == ["service:dflash.ready_s"]


def test_throughput_is_judged_by_its_bootstrap_intervals() -> None:
    def run(point: float, lower: float, upper: float) -> dict[str, float]:
        return {"perf.dflash.output_throughput": point, "perf.dflash.output_throughput.lower": lower,
                "perf.dflash.output_throughput.upper": upper}

    noisy = trend.perf_deltas(run(812.0, 790.0, 830.0), run(745.0, 700.0, 795.0), 5.0)
    (key,) = noisy
    assert key == "perf.dflash.output_throughput", "the bounds are part of the number, not numbers of their own"
    assert noisy[key]["significant"] and not noisy[key]["regression"]
    assert noisy[key]["rule"] == "95% intervals [700, 795] now and [790, 830] before overlap: within run-to-run spread"
    real = trend.perf_deltas(run(812.0, 790.0, 830.0), run(640.0, 628.0, 652.0), 5.0)[key]
    assert real["regression"] and real["rule"] == "95% intervals [628, 652] now and [790, 830] before do not overlap"
    faster = trend.perf_deltas(run(640.0, 628.0, 652.0), run(812.0, 790.0, 830.0), 5.0)[key]
    assert not faster["regression"]
    # without intervals (an older verdict) the history rule applies
    history = [{"perf.dflash.output_throughput": v} for v in (800.0, 820.0, 790.0)]
    old = trend.perf_deltas({"perf.dflash.output_throughput": 812.0}, {"perf.dflash.output_throughput": 560.0}, 5.0,
                            history)[key]
    assert old["regression"] and old["rule"] == "outside the last 3 good runs' range 790-820 by > 25%"


def test_the_fleet_page_draws_the_readiness_spread(tmp_path: Path) -> None:
    for i, ready in enumerate([41.0, 43.5, 250.0]):
        make_verdict(tmp_path / "in", f"gpu-{i}", GREEN if i < 2 else BROKEN,
                     services={"dflash": {**SERVICES["dflash"], "ready": {"total_s": ready}}})
    _merge(tmp_path / "in", tmp_path / "out")
    page = (tmp_path / "out" / "fleet-summary.html").read_text()
    assert "<h2>Readiness across hosts</h2>" in page
    svg = page[page.index('<div class="readiness-spread">') + len('<div class="readiness-spread">'):]
    svg = svg[:svg.index("</svg>") + len("</svg>")].strip()
    root = ET.fromstring(svg)  # inline: no xmlns (the page names no URL)
    assert sorted(c.findtext("title") or "" for c in root.iter("circle")) == [
        "gpu-0: 41.0 s", "gpu-1: 43.5 s", "gpu-2: 250.0 s"]
    assert "3 hosts: min 41, median 43.5, max 250 s (gpu-2)" in [t.text for t in root.iter("text")]


def test_a_narrowed_run_that_passed_joins_the_spread_an_interrupted_one_does_not(tmp_path: Path) -> None:
    """`suites/perf` alone is a partial run (nothing failed, the run was narrowed): its numbers are good ones."""
    def entry(verdict: str, run_id: str) -> dict:  # type: ignore[type-arg]
        return {"verdict": verdict, "run_id": run_id, "finished": run_id, "finished_ts": float(len(run_id)),
                "metrics": {"perf.dflash.p99_ttft_ms": 50.0}, "services": {"dflash": {"ready_s": 4.0}}}

    trend.record_good_runs(tmp_path, {"gpu-a": entry("partial", "p1"), "gpu-b": entry("interrupted", "i1"),
                                      "gpu-c": entry("fail", "f1")})
    (runs,) = [trend.read_good_runs(tmp_path, host) for host in ("gpu-a",)]
    assert [r["numbers"] for r in runs] == [{"perf.dflash.p99_ttft_ms": 50.0, "service:dflash.ready_s": 4.0}]
    assert trend.read_good_runs(tmp_path, "gpu-b") == [] and trend.read_good_runs(tmp_path, "gpu-c") == []


def test_a_damaged_good_runs_file_is_as_good_as_none(tmp_path: Path) -> None:
    """Nested too deep to parse is damaged like any other unreadable file: no RecursionError."""
    path = trend.good_runs_path(tmp_path, "gpu-a")
    path.parent.mkdir(parents=True)
    path.write_text("[" * 100_000)
    assert trend.read_good_runs(tmp_path, "gpu-a") == []


@pytest.mark.parametrize("provisioned", [True, False], ids=["provisioned", "attached"])
def test_a_changed_launch_command_is_what_changed_unless_the_run_started_it(tmp_path: Path,
                                                                           provisioned: bool) -> None:
    """SGLang 0.5.20+'s launch command is a fact of each service: an attached server started with other flags is
    "what changed"; a server this run started gets a free port in its command each run, which is noise."""
    history = fleet_verdicts.History(tmp_path / "history")

    def launched(port: int, tokens: int) -> dict[str, object]:
        return {**SERVICES["dflash"], "provisioned": provisioned, "url": f"http://127.0.0.1:{port}",
                "launch_command": f"--port {port} --speculative-algorithm DFLASH --speculative-num-draft-tokens {tokens}"}

    good = tmp_path / "good"
    make_verdict(good, "gpu-a", GREEN, run_id="good", finished=T0, services={"dflash": launched(41000, 8)})
    history.record([fleet_verdicts.LoadedVerdict(p, fleet_verdicts.read_verdict(p)) for p in good.glob("*.json")])
    bad = make_verdict(tmp_path / "bad", "gpu-a", BROKEN, run_id="bad", finished=T0 + DAY,
                       services={"dflash": launched(41000 if not provisioned else 42000, 16)})
    summary = fleet.build_summary([fleet_verdicts.LoadedVerdict(bad, fleet_verdicts.read_verdict(bad))], history=history)
    changes = summary["hosts"]["gpu-a"]["changed"]["changes"]
    assert changes == ([] if provisioned else [{
        "category": "service", "key": "services.dflash.launch_command",
        "before": "--port 41000 --speculative-algorithm DFLASH --speculative-num-draft-tokens 8",
        "after": "--port 41000 --speculative-algorithm DFLASH --speculative-num-draft-tokens 16"}])


def test_deltas_are_measurements_marked_better_or_worse_by_direction_worse_first() -> None:
    """A tok/s or accept length going up is better, a latency going up is worse; a threshold that moved is no
    perf change; the worse ones come first, whatever the size of the better ones."""
    before = {"perf.dflash.output_throughput": 500.0, "perf.dflash.p99_ttft_ms": 50.0,
              "acceptance:dflash.accept_rate": 0.0008, "token_latency:none.ceiling_ms": 250.0,
              "parity-slice:none~dflash.max_tie_rate": 0.25, "perf.dflash.accept_length": 4.0}
    after = {"perf.dflash.output_throughput": 520.0, "perf.dflash.p99_ttft_ms": 60.0,
             "acceptance:dflash.accept_rate": 0.3747, "token_latency:none.ceiling_ms": 300.0,
             "parity-slice:none~dflash.max_tie_rate": 0.3, "perf.dflash.accept_length": 3.5}
    deltas = trend.perf_deltas(before, after, 5.0)
    assert list(deltas) == ["perf.dflash.p99_ttft_ms", "perf.dflash.accept_length",
                            "acceptance:dflash.accept_rate", "perf.dflash.output_throughput"]
    assert [d["direction"] for d in deltas.values()] == ["worse", "worse", "better", "better"]
