"""[perf] sweep / sweep_requests / sweep_budget, [slo] / [slo.SERVICE] and the sweep gates of [floors.SERVICE]:
validated at load (one-line errors naming the file and the key), normalised, and --perf-sweep on the command
line (request-rate sweeps refused, saying why)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import jsonschema
import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.config.schema import profile_schema
from pytest_dflash.config.tables.slo import slo_for
from pytest_dflash.errors import InventoryError
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.layers.perf.sweep.plan import SweepPlan

BASE = """
[host]
connection = "ssh://root@10.1.2.200"

[services.none]
unit = "none.service"
algorithm = "NONE"
port = 30002

[services.dflash]
unit = "dflash.service"
algorithm = "DFLASH"
port = 30001
"""
GOOD = """
[perf]
concurrency = 8
sweep = [16, 1, 4, 4]
sweep_requests = 400
sweep_budget = "10m"

[slo]
ttft_p99_ms = 500
tpot_p99_ms = 40

[slo.dflash]
tpot_p99_ms = 60

[floors.dflash]
max_concurrency_within_slo = 16
goodput_at = {16 = 5.0, 4 = 2}
crossover_vs = "none"
speedup_up_to = 16
min_speedup = 1.1
"""


def _load(tmp_path: Path, extra: str) -> object:
    path = tmp_path / "gpu.toml"
    path.write_text(BASE + extra)
    return load_profile(path)


def test_the_tables_are_normalised_and_the_schema_agrees(tmp_path: Path) -> None:
    profile = _load(tmp_path, GOOD)
    perf = profile.perf  # type: ignore[attr-defined]
    assert (perf["sweep"], perf["sweep_requests"], perf["sweep_budget"]) == ([1, 4, 16], 400, 600.0)
    slo = profile.slo  # type: ignore[attr-defined]
    assert slo_for(slo, "none") == {"ttft_p99_ms": 500.0, "tpot_p99_ms": 40.0}
    assert slo_for(slo, "dflash") == {"ttft_p99_ms": 500.0, "tpot_p99_ms": 60.0}
    assert profile.floors["dflash"] == {  # type: ignore[attr-defined]
        "max_concurrency_within_slo": 16.0, "goodput_at.16": 5.0, "goodput_at.4": 2.0, "crossover_vs": "none",
        "speedup_up_to": 16.0, "min_speedup": 1.1}
    errors = list(jsonschema.Draft202012Validator(profile_schema()).iter_errors(tomllib.loads(BASE + GOOD)))
    assert errors == []
    plan = SweepPlan.resolve(perf)
    assert plan is not None and plan.levels == (1, 4, 16) and plan.budget_s == 600.0
    at16 = plan.settings_at(PerfSettings(concurrency=8, requests=50, warmup=2), 16)
    assert (at16.concurrency, at16.requests, at16.duration_s, at16.warmup) == (16, 400, None, 16)
    assert SweepPlan.resolve(perf, override=(2, 8)) == SweepPlan(levels=(2, 8), requests=400, budget_s=600.0)
    assert SweepPlan.resolve({}) is None
    # without sweep_requests: 20 resampling blocks of the level (at least 30 requests, for a p90)
    assert [SweepPlan(levels=(1, 4, 64)).requests_at(lvl) for lvl in (1, 4, 64)] == [30, 80, 1280]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[perf]\nsweep = ['5/s', '10/s']\n", "perf.sweep: '5/s': request-rate sweeps are not supported: the perf "
                                              "layer's load is closed-loop"),
        ("[perf]\nsweep = [0.5, 2]\n", "perf.sweep: 0.5 is not a whole number of requests in flight"),
        ("[perf]\nsweep = [0, 4]\n", "perf.sweep: expected concurrency levels (integers >= 1), got 0"),
        ("[perf]\nsweep = 4\n", "perf.sweep: expected a list of concurrency levels such as [1, 4, 16, 64]"),
        ("[perf]\nsweep = []\n", "perf.sweep: expected at least one concurrency level"),
        ("[perf]\nsweep_budget = 'soon'\n", "perf.sweep_budget: expected a duration like 90"),
        ("[perf]\nsweep_requests = 0\n", "perf.sweep_requests: expected an integer >= 1, got 0"),
        ("[slo]\nttft_p99 = 5\n", "slo.ttft_p99: unknown SLO: expected a service of this host (none, dflash) or a "
                                  "latency objective such as ttft_p99_ms"),
        ("[slo]\nttft_p99_ms = -5\n", "slo.ttft_p99_ms: expected a positive number of milliseconds, got integer -5"),
        ("[slo.ddtree]\nttft_p99_ms = 5\n", "slo.ddtree: expected a service of this host (none, dflash) or an SLO"),
        ("[slo.dflash]\nlatency = 5\n", "slo.dflash.latency: unknown SLO"),
        ("[slo]\nttft_p99_ms = 5\n[floors.dflash]\nmax_concurrency_within_slo = 0\n",
         "floors.dflash.max_concurrency_within_slo: expected a concurrency level (an integer >= 1), got integer 0"),
        ("[floors.dflash]\nmax_concurrency_within_slo = 4\n",
         "floors.dflash.max_concurrency_within_slo: needs SLOs to judge: add an [slo] table"),
        ("[slo]\nttft_p99_ms = 5\n[floors.dflash]\ngoodput_at = 5\n",
         "floors.dflash.goodput_at: expected a table of level = requests/s such as {16 = 5.0}, got integer 5"),
        ("[slo]\nttft_p99_ms = 5\n[floors.dflash]\ngoodput_at = {x = 5}\n",
         "floors.dflash.goodput_at.x: expected a concurrency level (an integer >= 1) as the key"),
        ("[slo]\nttft_p99_ms = 5\n[floors.dflash]\ngoodput_at = {16 = 0}\n",
         "floors.dflash.goodput_at.16: expected a positive number of requests/s, got integer 0"),
        ("[floors.dflash]\ncrossover_vs = 'none'\n", "floors.dflash.speedup_up_to: missing required key: "
                                                     "crossover_vs and speedup_up_to go together"),
        ("[floors.dflash]\ncrossover_vs = 'dflash'\nspeedup_up_to = 4\n",
         "floors.dflash.crossover_vs: expected the name of another service of this host (none)"),
        ("[floors.dflash]\nmin_speedup = 1.2\n", "floors.dflash.min_speedup: needs crossover_vs and speedup_up_to"),
        ("[floors.dflash]\ncrossover = 'none'\n", "floors.dflash.crossover: unknown floor (did you mean "),
    ],
)
def test_bad_tables_are_one_line_naming_file_and_key(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(InventoryError) as info:
        _load(tmp_path, extra)
    text = str(info.value)
    assert text.startswith(str(tmp_path / "gpu.toml")) and "\n" not in text, text
    assert message in text, text


@pytest.mark.parametrize(("value", "message"), [
    ("1,4,16", None),
    ("2rps,4rps", "--perf-sweep / dflash_perf_sweep: '2rps': request-rate sweeps are not supported"),
    ("1,x", "--perf-sweep / dflash_perf_sweep: expected concurrency levels (integers >= 1), got 'x'"),
])
def test_perf_sweep_on_the_command_line(pytester: pytest.Pytester, value: str, message: str | None) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--perf-sweep", value, "-p", "no:cacheprovider")
    if message is None:
        assert result.ret == 0
    else:
        assert result.ret == 4
        result.stderr.fnmatch_lines([f"ERROR: {message}*"])
