"""[perf] and [floors.SERVICE] tables: validated at load (one-line errors), resolved with the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.errors import InventoryError
from pytest_dflash.layers.perf.options import options_from_config
from pytest_dflash.layers.perf.settings import PerfOverrides, PerfSettings

ROOT = Path(__file__).parents[3]
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


def load(tmp_path: Path, extra: str) -> object:
    path = tmp_path / "gpu.toml"
    path.write_text(BASE + extra)
    return load_profile(path)


def test_shipped_profiles_have_perf_and_floor_tables() -> None:
    local = load_profile(ROOT / "hosts" / "local.toml")
    assert local.perf["concurrency"] == 1 and local.perf["endpoint"] == "generate"
    assert set(local.floors) == {"none", "dflash", "ddtree"}
    assert local.floors["ddtree"]["speedup_vs"] == "none" and local.floors["dflash"]["output_tok_s"] > 0
    ct200 = load_profile(ROOT / "hosts" / "ct200.toml")
    assert ct200.perf["requests"] >= 299  # a p99 ceiling (ttft_p99_ms) needs 299 requests to be bounded at 95 %
    assert ct200.floors["ddtree"]["speedup_vs"] == "dflash"


def test_valid_tables_are_normalised(tmp_path: Path) -> None:
    profile = load(tmp_path, """
[perf]
concurrency = 4
duration = "2m"
request_timeout = "30s"
temperature = 0

[perf.none]
requests = 50

[floors.dflash]
output_tok_s = 100
ttft_p99_ms = 800
e2e_median_ms = 900
tpot_p90_ms = 40
speedup_vs = "none"
speedup = 2
confidence = 0.99
regression_pct = 15
""")
    assert profile.perf == {"concurrency": 4, "duration": 120.0, "request_timeout": 30.0, "temperature": 0.0,  # type: ignore[attr-defined]
                            "services": {"none": {"requests": 50}}}
    assert profile.floors["dflash"] == {"output_tok_s": 100.0, "ttft_p99_ms": 800.0, "e2e_median_ms": 900.0,  # type: ignore[attr-defined]
                                        "tpot_p90_ms": 40.0, "speedup_vs": "none", "speedup": 2.0,
                                        "confidence": 0.99, "regression_pct": 15.0}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[perf]\nconcurency = 4\n", "perf.concurency: unknown key (did you mean 'concurrency'?)"),
        ("[perf]\nconcurrency = 0\n", "perf.concurrency: expected an integer >= 1, got 0"),
        ("[perf]\nconcurrency = '4'\n", "perf.concurrency: expected an integer, got string '4'"),
        ("[perf]\nendpoint = 'grpc'\n", "perf.endpoint: expected one of auto, generate, chat, completions"),
        ("[perf]\nduration = 'soon'\n", "perf.duration: expected a duration like 90, '90s' or '15m'"),
        ("[perf]\nduration = 0\n", "perf.duration: expected a positive duration"),
        ("[perf]\nmax_loop_lag_ms = -1\n", "perf.max_loop_lag_ms: expected a positive number"),
        ("[perf]\nclient_procs = 0\n", "perf.client_procs: expected an integer >= 1, got 0"),
        ("[perf.ddtree]\nrequests = 5\n", "perf.ddtree: expected a service of this host (none, dflash)"),
        ("[perf.none]\nconcurrency = 5\n", "perf.none.concurrency: unknown key"),
        ("[floors.dflash]\noutput_tok_s = -3\n", "floors.dflash.output_tok_s: expected a positive number, got integer -3"),
        ("[floors.dflash]\nttft_p99_ms = true\n", "floors.dflash.ttft_p99_ms: expected a positive number, got boolean"),
        ("[floors.dflash]\nttft_p100_ms = 5\n", "floors.dflash.ttft_p100_ms: unknown floor: a percentile must be in"),
        ("[floors.dflash]\nthroughput = 5\n", "floors.dflash.throughput: unknown floor"),
        ("[floors.dflash]\nspeedup = 2\n", "floors.dflash.speedup_vs: missing required key: speedup and speedup_vs go"),
        ("[floors.dflash]\nspeedup_vs = 'none'\n", "floors.dflash.speedup: missing required key"),
        ("[floors.dflash]\nspeedup_vs = 'dflash'\nspeedup = 2\n",
         "floors.dflash.speedup_vs: expected the name of another service of this host (none), got string 'dflash'"),
        ("[floors.dflash]\nconfidence = 95\n", "floors.dflash.confidence: expected a confidence level in (0.5, 1)"),
        ("[floors.dflash]\nregression_pct = 150\n", "floors.dflash.regression_pct: expected a percentage in (0, 100)"),
        ("[floors.ddtree]\noutput_tok_s = 5\n", "floors.ddtree: expected a service of this host (none, dflash)"),
    ],
)
def test_malformed_tables_are_one_line_naming_file_and_key(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(InventoryError) as info:
        load(tmp_path, extra)
    text = str(info.value)
    assert text.startswith(str(tmp_path / "gpu.toml")), text
    assert message in text, text
    assert "\n" not in text


def test_a_bad_perf_table_is_a_usage_error_exit_4(pytester: pytest.Pytester) -> None:
    profile = pytester.path / "gpu.toml"
    profile.write_text(BASE + "[perf]\nconcurrency = 0\n")
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--host", str(profile), "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"ERROR: {profile}: perf.concurrency: expected an integer >= 1, got 0"])


def test_settings_layer_profile_service_and_command_line() -> None:
    perf = {"concurrency": 4, "requests": 100, "duration": 60.0, "output_len": 64,
            "services": {"none": {"duration": 30.0}}}
    dflash = PerfSettings.resolve(perf, "dflash")
    assert (dflash.concurrency, dflash.requests, dflash.duration_s, dflash.output_len) == (4, 100, 60.0, 64)
    assert dflash.warmup is None and dflash.load_spec(native=True, speculative=True).warmup_requests == 4
    none = PerfSettings.resolve(perf, "none")  # a layer that sets requests or duration replaces both
    assert (none.requests, none.duration_s) == (None, 30.0)
    cli = PerfSettings.resolve(perf, "none", PerfOverrides(requests=8, concurrency=2, warmup=0))
    assert (cli.requests, cli.duration_s, cli.concurrency, cli.warmup) == (8, None, 2, 0)
    assert PerfSettings.resolve({}, "x").requests == 200


def test_load_spec_follows_the_server_dialect() -> None:
    settings = PerfSettings(concurrency=2, requests=10)
    native = settings.load_spec(native=True, speculative=True)
    assert native.endpoint == "generate" and native.server_accept_length
    assert not settings.load_spec(native=True, speculative=False).server_accept_length  # NONE: nothing to flush
    openai = settings.load_spec(native=False, speculative=True, model="qwen")
    assert openai.endpoint == "chat" and not openai.server_accept_length and openai.model == "qwen"
    assert PerfSettings(endpoint="completions").load_spec(native=True, speculative=True).endpoint == "completions"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--perf-requests", "0"], "--perf-requests / dflash_perf_requests: '0' must be >= 1"),
        (["--perf-concurrency", "two"], "--perf-concurrency / dflash_perf_concurrency: 'two' is not an integer"),
        (["--perf-duration", "soon"], "--perf-duration / dflash_perf_duration: 'soon' is not a duration"),
        (["--perf-client-procs", "0"], "--perf-client-procs / dflash_perf_client_procs: '0' must be >= 1"),
    ],
)
def test_bad_perf_options_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest(*args, "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"ERROR: {message}*"])


def test_perf_options_are_in_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--update-baseline*", "*--baseline-dir=DIR*", "*--perf-requests=REQUESTS*",
                                 "*--perf-duration=DURATION*", "*--perf-client-procs=*"], consecutive=False)


def test_client_procs_from_the_profile_and_the_command_line(tmp_path: Path) -> None:
    profile = load(tmp_path, "[perf]\nconcurrency = 4\nclient_procs = 2\n")
    perf = profile.perf  # type: ignore[attr-defined]
    assert perf["client_procs"] == 2
    settings = PerfSettings.resolve(perf, "dflash")
    assert settings.load_spec(native=True, speculative=True).client_procs == 2
    assert "2 client processes" in settings.describe(True)
    assert PerfSettings.resolve(perf, "dflash", PerfOverrides(client_procs=4)).client_procs == 4
    assert PerfSettings.resolve({}, "dflash").load_spec(native=True, speculative=False).client_procs == 1
    with pytest.raises(ValueError, match=r"client_procs \(4\) > concurrency \(1\)"):
        PerfSettings(concurrency=1, client_procs=4).load_spec(native=True, speculative=False)


def test_perf_client_procs_option_reaches_the_settings(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
from pytest_dflash.layers.perf.hooks import OPTIONS_KEY

def test_option(pytestconfig):
    assert pytestconfig.stash[OPTIONS_KEY].overrides.client_procs == 3
""")
    pytester.runpytest("--perf-client-procs", "3", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_baselines_live_in_the_report_directory_unless_given(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """--dflash-report elsewhere takes the baselines with it (issue 32); --baseline-dir still wins."""
    default = options_from_config(pytester.parseconfig())
    assert default.baseline_dir == pytester.path / "reports" / "baselines"
    moved = options_from_config(pytester.parseconfig(f"--dflash-report={tmp_path / 'out'}"))
    assert moved.baseline_dir == tmp_path / "out" / "baselines"
    given = options_from_config(pytester.parseconfig(f"--dflash-report={tmp_path / 'out'}",
                                                     f"--baseline-dir={tmp_path / 'b'}"))
    assert given.baseline_dir == tmp_path / "b"
