"""`pytest --host A --host B suites/perf -k crossover` against real refservers: a load sweep, interleaved, with
the gates judged on the curve.

Two hosts in one run. "stops-paying" charges the tokens a pass verifies (--gpu-token-us 1100 with 8 ms steps):
DFLASH is ~1.2x NONE at concurrency 1 and ~0.65x at 8, so a crossover gate that asks for 16 fails, naming
concurrency 8 and its upper bound. "pays-off" keeps the flat cost of hosts/local.toml (8 ms steps, no token
cost): DFLASH is ~2x NONE at concurrency 1 and 2 and passes a gate that asks for 2. (Higher, this 2-core
machine's CPU, not the emulated GPU, sets the pace of the tiny model's drafter: docs/refserver.md, *The
crossover on CPU*.)
The curve reaches sweep.json,
the verdict's metrics and JUnit.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.load.curve import SweepCurve

PROFILE = """
[host]
connection = "local://"
python = "auto"
provision = "always"

[services.none]
kind = "process"
algorithm = "NONE"
command = ["{{python}}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{{port}}",
           "--speculative-algorithm", "NONE", {cost}]
ready_timeout = "60s"

[services.dflash]
kind = "process"
algorithm = "DFLASH"
command = ["{{python}}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{{port}}",
           "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "{block}", {cost}]
ready_timeout = "60s"

[perf]
endpoint = "generate"
prompt_len = 8
output_len = 8
max_loop_lag_ms = 500      # the client shares two cores with four servers
max_client_cpu = 1.0
sweep = {levels}
sweep_budget = "2m"

[slo]
e2e_p90_ms = 5000

[floors.dflash]
crossover_vs = "none"
speedup_up_to = {up_to}
"""
PAYS_OFF = {"cost": '"--gpu-step-ms", "8"', "block": 8, "levels": "[1, 2]", "up_to": 2}
STOPS_PAYING = {"cost": '"--gpu-step-ms", "8", "--gpu-token-us", "1100"', "block": 8, "levels": "[1, 8]",
                "up_to": 16}


def _profile(directory: Path, name: str, values: dict[str, object]) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(PROFILE.format(**values))
    return path


def test_a_crossover_below_the_gate_fails_naming_the_level_and_the_healthy_host_passes(  # type: ignore[no-untyped-def]
        run_suite, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    result = run_suite("perf", "--host", str(_profile(tmp_path, "pays-off", PAYS_OFF)),
                       "--host", str(_profile(tmp_path, "stops-paying", STOPS_PAYING)),
                       "-k", "test_crossover", f"--junitxml={junit}")
    assert_no_crash(result)
    result.assert_outcomes(failed=1, passed=1, deselected=22)
    assert verdict(run_suite.reports, "pays-off")["layers"]["perf"]["outcome"] == "passed"
    result.stdout.fnmatch_lines([
        "*FAILED *test_crossover[[]stops-paying/dflash[]]: Failed: stops-paying/dflash: crossover_vs_none: FAIL at concurrency 8 — 0.*x, 95% upper bound 0.*x "
        "< min_speedup 1x (asked up to concurrency 16; n=160 requests); the crossover: dflash (DFLASH) is slower "
        "than none from concurrency 8 (0.*x, 95% upper bound 0.*x)",
    ])
    result.stdout.fnmatch_lines([  # the terminal's summary of each host's curve
        "*= dflash sweep =*",
        "stops-paying: speed-up dflash/none: c1 *x [[]*, *[]], c8 0.*x [[]0.*, 0.*[]]; the crossover: dflash (DFLASH) is "
        "slower than none from concurrency 8*",
    ])
    bad = SweepCurve.from_json((run_suite.reports / "perf" / "stops-paying" / "sweep.json").read_text())
    speedup = bad.speedup("dflash", "none")
    assert speedup is not None and speedup.crossover == 8
    assert [g.outcome for g in bad.gates] == ["fail"]
    good = SweepCurve.from_json((run_suite.reports / "perf" / "pays-off" / "sweep.json").read_text())
    assert good.levels == (1, 2) and [g.outcome for g in good.gates] == ["pass"]
    none = good.service("none")
    assert none is not None and [p.requests for p in none.levels] == [30, 40]  # 20 blocks, at least 30
    metrics = verdict(run_suite.reports, "stops-paying")["metrics"]
    assert metrics["perf.dflash.sweep.crossover_vs_none"] == 8.0
    assert metrics["perf.dflash.sweep.c8.speedup_vs_none.upper"] < 1.0
    assert metrics["perf.dflash.sweep.crossover_vs_none.pass"] == 0.0
    assert metrics["perf.none.sweep.c8.output_tok_s"] > metrics["perf.dflash.sweep.c8.output_tok_s"]
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert float(props["dflash.perf.dflash.sweep.c2.speedup_vs_none"] or 0) > 1.0
    assert "dflash.perf.dflash.sweep.c1.goodput_req_s" in props
    assert json.loads((run_suite.reports / "perf" / "pays-off" / "sweep.json").read_text())["host"] == "pays-off"
