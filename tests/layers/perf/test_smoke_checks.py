"""The perf layer's smoke-sized checks: time per output token of one stream, and no /flush_cache where not allowed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from perf_fakes import fake_result

from pytest_dflash.client.sampling import Stream
from pytest_dflash.config.loader import load_profile
from pytest_dflash.layers.perf.judging import judge_accept_length
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.layers.perf.token_latency import (
    DEFAULT_TPOT_CEILING_MS,
    judge_token_latency,
    stream_token_latency,
    token_latency_ceiling,
)
from pytest_dflash.load import LoadResult, LoadSpec

DATA = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h200"
LOCAL = Path(__file__).parents[3] / "pytest_dflash" / "config" / "builtin" / "local.toml"


def recorded_stream(gap_s: float, *, first_s: float = 0.05) -> Stream:
    """The real DFLASH /generate stream of 16 tokens (one per event), with arrivals `gap_s` apart."""
    lines: list[str] = json.loads((DATA / "responses.json").read_text())["dflash/generate_stream"]["sse_lines"]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    arrivals = [first_s + i * gap_s for i in range(len(events))]
    return Stream(events, arrivals, True, lines, arrivals[-1], 200, "text/event-stream")


def test_tpot_of_the_recorded_stream_is_the_gap_between_tokens() -> None:
    latency = stream_token_latency(recorded_stream(0.02), 16)
    assert latency.ttft_ms == pytest.approx(50.0) and latency.tpot_ms == pytest.approx(20.0)
    assert judge_token_latency(latency, DEFAULT_TPOT_CEILING_MS, "the default sanity ceiling").outcome == "pass"


def test_a_first_event_with_several_tokens_counts_them() -> None:
    """A speculative server may put several tokens in its first event: TPOT counts only the later ones."""
    events = [{"output_ids": [1, 2, 3, 4]}, {"output_ids": [1, 2, 3, 4, 5, 6, 7, 8]}]
    latency = stream_token_latency(Stream(events, [0.1, 0.5], True, [], 0.5), 8)
    assert latency.tpot_ms == pytest.approx(100.0)  # 400 ms for the 4 tokens after the first event


def test_openai_chunks_count_one_token_each() -> None:
    events: list[dict[str, Any]] = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                                    *({"choices": [{"delta": {"content": "x"}}]} for _ in range(5)),
                                    {"choices": [], "usage": {"completion_tokens": 5}}]
    latency = stream_token_latency(Stream(events, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.51], True, [], 0.6), 5)
    assert latency.ttft_ms == pytest.approx(100.0) and latency.tpot_ms == pytest.approx(100.0)


def test_a_slow_stream_fails_with_its_rate_and_the_ceiling() -> None:
    judgement = judge_token_latency(stream_token_latency(recorded_stream(0.4), 16), 250.0, "the default sanity ceiling")
    assert judgement.outcome == "fail"
    assert ("TPOT (time per output token) FAIL — 400.0 ms (2.5 tokens/s) > ceiling 250 ms (the default sanity ceiling)"
            in judgement.message)


def test_one_event_only_is_inconclusive_not_a_pass() -> None:
    latency = stream_token_latency(Stream([{"output_ids": [1, 2, 3]}], [0.1], True, [], 0.1), 3)
    assert latency.tpot_ms is None and judge_token_latency(latency, 250.0, "x").outcome == "inconclusive"


def test_a_stream_delivered_whole_is_inconclusive_not_a_pass() -> None:
    """A buffering gateway hands a slow server's 16 tokens over at once: TPOT ~0 ms once passed the sanity
    ceiling, however slow the server."""
    whole = recorded_stream(0.00002, first_s=20.0)
    judgement = judge_token_latency(stream_token_latency(whole, 16), 250.0, "x")
    assert judgement.outcome == "inconclusive", judgement.message
    assert "within 1 ms of the first: nothing streamed after the first token" in judgement.message
    # a server this fast (a refserver without a GPU cost model): 16 tokens within 1 ms after a 5 ms TTFT hide
    # at most 0.3 ms per token, so the ceiling holds
    fast = judge_token_latency(stream_token_latency(recorded_stream(0.00002, first_s=0.005), 16), 250.0, "x")
    assert fast.outcome == "pass" and "at most 0.3 ms per token" in fast.message, fast.message


def test_the_ceiling_is_the_option_else_the_default_raised_by_a_slower_profile() -> None:
    assert token_latency_ceiling({}, None) == (DEFAULT_TPOT_CEILING_MS, "the default sanity ceiling")
    assert token_latency_ceiling({"itl_p99_ms": 100.0}, None) == (DEFAULT_TPOT_CEILING_MS, "the default sanity ceiling")
    assert token_latency_ceiling({"tpot_mean_ms": 900.0, "ttft_p50_ms": 5000.0}, None) == (
        900.0, "the profile's tpot_mean_ms")  # TTFT is not a per-token latency
    assert token_latency_ceiling({"tpot_mean_ms": 900.0}, 40.0) == (40.0, "--tpot-ceiling-ms")
    local = load_profile(LOCAL).floors["dflash"]
    assert token_latency_ceiling(local, None) == (300.0, "the profile's itl_p99_ms")


def test_tpot_ceiling_option_parses_and_bad_values_name_the_flag(pytester: pytest.Pytester) -> None:
    from pytest_dflash.layers.perf.hooks import OPTIONS_KEY

    options = pytester.parseconfigure("--tpot-ceiling-ms", "120").stash[OPTIONS_KEY]
    assert (options.tpot_ceiling_ms, options.tpot_ceiling_off) == (120.0, False)
    assert pytester.parseconfigure("--tpot-ceiling-ms", "off").stash[OPTIONS_KEY].tpot_ceiling_off
    with pytest.raises(pytest.UsageError, match="--tpot-ceiling-ms / dflash_tpot_ceiling_ms: 'fast' is not a number"):
        pytester.parseconfigure("--tpot-ceiling-ms", "fast")


@pytest.mark.parametrize(("raw", "problem"), [
    ("nan", "is not a finite number"), ("inf", "is not a finite number"), ("-inf", "is not a finite number"),
    ("1e999", "is not a finite number"), ("infms", "is not a finite number"), ("-5", "must be > 0"),
    ("0", "must be > 0"),
])
def test_a_tpot_ceiling_that_no_request_could_judge_is_a_usage_error(pytester: pytest.Pytester, raw: str,
                                                                      problem: str) -> None:
    """nan and inf were accepted: a ceiling of inf passes every server, nan's comparisons are all False."""
    with pytest.raises(pytest.UsageError) as info:
        pytester.parseconfigure(f"--tpot-ceiling-ms={raw}")  # "=": argparse takes "-inf" for a flag
    assert str(info.value) == f"--tpot-ceiling-ms / dflash_tpot_ceiling_ms: {raw!r} {problem}"


def test_a_bad_tpot_ceiling_stops_the_run_with_one_line_and_exit_4(pytester: pytest.Pytester) -> None:
    suites = Path(__file__).parents[3] / "suites"
    result = pytester.runpytest_subprocess(str(suites / "smoke"), "-p", "no:cacheprovider", "--host", "local",
                                           "--tpot-ceiling-ms", "inf", timeout=60)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 4, output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
    lines = [line for line in result.stderr.str().splitlines() if line.strip()]
    assert lines == ["ERROR: --tpot-ceiling-ms / dflash_tpot_ceiling_ms: 'inf' is not a finite number"], output


def test_without_permission_the_perf_run_sends_no_flush_and_says_why() -> None:
    specs: list[LoadSpec] = []

    def runner(url: str, spec: LoadSpec, **kwargs: Any) -> LoadResult:
        specs.append(spec)
        return fake_result(verify=8)

    run = ServiceRun.measure(host="h", service="s", algorithm="DFLASH", url="http://x", native=True,
                             settings=PerfSettings(), runner=runner, flush_refused="h/s is attached")
    assert specs[-1].server_accept_length is False  # run_load POSTs /flush_cache only when this is set
    assert run.server_accept_skipped is not None and "h/s is attached" in run.server_accept_skipped
    assert "no server-side value (not read: it is only meaningful after a /flush_cache" in \
        judge_accept_length(run, {"accept_length": 3.0}).message
    assert run.document()["dflash_perf"]["server_accept_length_skipped"] == run.server_accept_skipped
    allowed = ServiceRun.measure(host="h", service="s", algorithm="DFLASH", url="http://x", native=True,
                                 settings=PerfSettings(), runner=runner)
    assert specs[-1].server_accept_length is True and allowed.server_accept_skipped is None
