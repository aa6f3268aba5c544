"""The table across services (GuideLLM's shape): one row per service, failing hosts first, from the verdict's
metrics of real recorded H200 runs (tests/data/sglang-0.5.17-h200-ddtree/run2-three/perf)."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from pytest_dflash.layers.perf.judgement import Comparison, Judgement
from pytest_dflash.layers.perf.report import runs_table
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.load import LoadResult
from pytest_dflash.report.perf_table import PerfRow, perf_table, rows_from_metrics

PERF = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-ddtree" / "run2-three" / "perf"


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.rows[-1].append("")

    def handle_data(self, data: str) -> None:
        if self.rows and self.rows[-1] and not data.startswith("table."):
            self.rows[-1][-1] += data


def _cells(html: str) -> list[list[str]]:
    parser = _Cells()
    parser.feed(html)
    return parser.rows


def _run(name: str, algorithm: str) -> ServiceRun:
    result = LoadResult.from_json((PERF / f"{name}.json").read_text())
    return ServiceRun(host="h200", service=name, algorithm=algorithm, settings=PerfSettings(), result=result)


def test_the_services_of_a_perf_test_in_one_table() -> None:
    plain, dflash = _run("plain", "NONE"), _run("dflash", "DFLASH")
    dflash.comparisons["plain"] = Comparison(service="dflash", versus="plain", algorithm="DFLASH",
                                             versus_algorithm="NONE", point=1.08, lower=1.01, upper=1.15,
                                             confidence=0.95, concurrency=8, accept_length=1.02,
                                             versus_accept_length=None)
    rows = _cells(runs_table([plain, dflash]))
    assert rows[0] == ["service", "algorithm", "output tok/s", "req/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
                       "ITL p50 (ms)", "ITL p99 (ms)", "e2e p50 (ms)", "e2e p99 (ms)",
                       "accept length, client (judged)", "accept length, server-reported",
                       "speed-up (output tok/s)"]
    by_service = {row[0]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    m = dflash.result.metrics
    assert [by_service["dflash"][k] for k in ("algorithm", "output tok/s", "req/s", "TTFT p50 (ms)",
                                              "e2e p50 (ms)", "e2e p99 (ms)")] == [
        "DFLASH", f"{m['output_throughput']:.1f}", f"{m['request_throughput']:.2f}", f"{m['median_ttft_ms']:.1f}",
        f"{m['median_e2e_latency_ms']:.1f}", f"{m['p99_e2e_latency_ms']:.1f}"]
    assert by_service["dflash"]["speed-up (output tok/s)"] == "1.08x vs plain"
    assert by_service["plain"]["accept length, client (judged)"] == "", "no accept length on a plain service"


def test_the_accept_length_the_check_judges_is_the_one_shown_and_the_servers_is_labelled() -> None:
    """The recorded H200 DFLASH run: its requests' Σ tokens / Σ verify steps is 1.016, the server says 1.000.
    The headline and the accept-length check use 1.016; the table showed 1.000 under a bare "accept length"."""
    dflash = _run("dflash", "DFLASH")
    assert dflash.accept_length is not None and dflash.result.server_accept_length is not None
    row = dict(zip(*_cells(runs_table([dflash]))[:2], strict=True))
    assert row["accept length, client (judged)"] == f"{dflash.accept_length:.3f}" == "1.016"
    assert row["accept length, server-reported"] == f"{dflash.result.server_accept_length:.3f}" == "1.000"
    assert f"accept length {dflash.accept_length:.3f} (client; server-reported 1.000)" in dflash.headline()
    assert dflash.metrics()["perf.dflash.accept_length"] == round(dflash.accept_length, 4)


def test_failing_hosts_come_first() -> None:
    metrics = {"perf.dflash.output_throughput": 500.0, "perf.dflash.output_tok_s.bound": 480.0}
    rows = [*rows_from_metrics("a-good", metrics, {"dflash": "DFLASH"}),
            *rows_from_metrics("z-bad", metrics, {"dflash": "DFLASH"}, failing=True)]
    assert [r[0] for r in _cells(perf_table(rows))[1:]] == ["z-bad", "a-good"]
    assert perf_table([]) == ""
    assert 'class="fail"' in perf_table([PerfRow(host="h", service="s", failing=True, output_tok_s=1.0)])


def test_a_failed_floor_marks_the_row() -> None:
    run = _run("dflash", "DFLASH")
    run.judge([Judgement(key="output_tok_s", outcome="fail", message="m", threshold=900.0)])
    assert '<tr class="fail">' in runs_table([run])
