"""Trend vs the previous summary, failing-since, and "what changed" vs each host's last good verdict."""

from __future__ import annotations

import json
from pathlib import Path

from support.fleet_helpers import BROKEN, GREEN, SERVICES, make_verdict

from pytest_dflash.cli import main
from pytest_dflash.fleet import summary as fleet
from pytest_dflash.fleet import trend
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
                     metrics={"dflash": {"output_tok_s": 800.0, "ttft_p99_ms": 50.0}})
    first = _merge(night1, out)
    assert first["trend"] is None and first["totals"]["pass"] == 3
    night2 = tmp_path / "n2"
    make_verdict(night2, "gpu-a", GREEN, run_id="n2", finished=T0 + DAY,
                 metrics={"dflash": {"output_tok_s": 600.0, "ttft_p99_ms": 80.0}})   # slower, still passes
    make_verdict(night2, "gpu-b", BROKEN, run_id="n2", finished=T0 + DAY)
    make_verdict(night2, "gpu-d", GREEN, run_id="n2", finished=T0 + DAY)             # new host; gpu-c is gone
    second = _merge(night2, out)  # --previous defaults to the summary already in --out
    trend = second["trend"]
    assert trend["previous"]["run_ids"] == ["n1"]
    assert trend["new_failures"] == [{"host": "gpu-b", "was": "pass", "layers": ["service", "generation"],
                                      "diagnosis": ["flashinfer-sm12x-nvcc"]}]
    assert trend["fixed"] == [] and trend["disappeared"] == ["gpu-c"] and trend["new_hosts"] == ["gpu-d"]
    perf = {(p["host"], p["metric"]): p for p in trend["perf"]}
    tok = perf[("gpu-a", "dflash.output_tok_s")]
    assert (tok["previous"], tok["current"], tok["pct"], tok["regression"]) == (800.0, 600.0, -25.0, True)
    ttft = perf[("gpu-a", "dflash.ttft_p99_ms")]
    assert ttft["pct"] == 60.0 and ttft["regression"], "a higher latency is a regression"
    gpu_b = second["hosts"]["gpu-b"]
    assert gpu_b["failing_since"] == iso(T0 + DAY)
    assert gpu_b["last_good"]["run_id"] == "n1"
    assert gpu_b["changed"]["basis"] == "services" and gpu_b["changed"]["count"] == 0
    night3 = tmp_path / "n3"
    make_verdict(night3, "gpu-a", GREEN, run_id="n3", finished=T0 + 2 * DAY,
                 metrics={"dflash": {"output_tok_s": 805.0, "ttft_p99_ms": 50.0}})
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
    lines = fleet.headline(summary)
    assert any(line.startswith("gpu-a: failing since") and "changed since last good run good" in line
               for line in lines), lines
    page = (out / "fleet-summary.html").read_text()
    assert "What changed since the last good run good" in page and "facts.env.packages.torch" in page


def test_what_changed_falls_back_to_services_and_says_why(tmp_path: Path) -> None:
    history = fleet.History(tmp_path / "history")
    good = tmp_path / "good"
    make_verdict(good, "gpu-a", GREEN, run_id="good", finished=T0,
                 services={"dflash": {**SERVICES["dflash"], "provisioned": True, "url": "http://127.0.0.1:41000"}})
    history.record([fleet.LoadedVerdict(p, fleet.read_verdict(p)) for p in good.glob("*.json")])
    bad = make_verdict(tmp_path / "bad", "gpu-a", BROKEN, run_id="bad", finished=T0 + DAY, facts=ENV_GOOD,
                       services={"dflash": {**SERVICES["dflash"], "algorithm": "DDTREE", "provisioned": True,
                                            "url": "http://127.0.0.1:42000"}})
    summary = fleet.build_summary([fleet.LoadedVerdict(bad, fleet.read_verdict(bad))], history=history)
    changed = summary["hosts"]["gpu-a"]["changed"]
    assert changed["basis"] == "services" and "last good verdict has no env/facts snapshot" in changed["note"]
    assert changed["changes"] == [{"category": "service", "key": "services.dflash.algorithm",
                                   "before": "DFLASH", "after": "DDTREE"}], "a provisioned service's port is noise"


def test_history_keeps_the_newest_good_verdict_only(tmp_path: Path) -> None:
    history = fleet.History(tmp_path / "history")

    def loaded(directory: Path, run: str, when: float, outcomes: dict[str, str]) -> fleet.LoadedVerdict:
        path = make_verdict(directory, "gpu-a", outcomes, run_id=run, finished=when)
        return fleet.LoadedVerdict(path, fleet.read_verdict(path))

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
                               {"perf.dflash.failed": 3.0, "perf.dflash.output_throughput": 103.0}, 5.0)
    assert deltas["perf.dflash.failed"]["regression"] and deltas["perf.dflash.failed"]["pct"] is None
    assert not deltas["perf.dflash.output_throughput"]["significant"]
