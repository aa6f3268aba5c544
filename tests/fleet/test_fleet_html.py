"""fleet-summary.html's numbers and headers: measured numbers only (no threshold dressed as a measurement),
one perf table across services with failing hosts first, one column named "host", an attached host's
connection spelled out."""

from __future__ import annotations

import json
from pathlib import Path

from support.fleet_helpers import BROKEN, GREEN, SERVICES, make_verdict

from pytest_dflash.cli import main
from pytest_dflash.fleet.html import render_html

METRICS = {"perf": {"dflash": {"output_throughput": 514.9, "median_ttft_ms": 41.0, "p99_ttft_ms": 88.0,
                               "median_itl_ms": 6.1, "p99_itl_ms": 9.9, "accept_length": 4.923,
                               "output_tok_s": {"pass": 0.0, "bound": 490.0}, "concurrency": 8.0}},
           "token_latency:none": {"ttft_ms": 30.0, "tpot_ms": 7.5, "ceiling_ms": 250.0},
           "parity-slice:none~dflash": {"exact_rate": 1.0, "max_tie_rate": 0.25, "tie_gap": 0.001}}


def _summary(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    make_verdict(tmp_path / "in", "gpu-a", GREEN, metrics=METRICS)
    make_verdict(tmp_path / "in", "gpu-b", BROKEN, metrics=METRICS)
    main(["merge", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "-q"])
    data: dict = json.loads((tmp_path / "out" / "fleet-summary.json").read_text())  # type: ignore[type-arg]
    return data


def test_measured_numbers_only_and_one_perf_table_failing_first(tmp_path: Path) -> None:
    page = render_html(_summary(tmp_path))
    for threshold in ("ceiling_ms", "max_tie_rate", "tie_gap", "output_tok_s.bound", "output_tok_s.pass", "concurrency"):
        assert threshold not in page, threshold
    assert "<td>token_latency:none.ttft_ms</td>" in page and "<td>perf.dflash.p99_itl_ms</td>" in page
    table = page.split("<h2>Perf across services</h2>", 1)[1].split("</table>", 1)[0]
    assert table.index("gpu-b") < table.index("gpu-a"), "the failing host first"
    assert "<td>DFLASH</td>" in table and ">514.9<" in table and ">4.923<" in table


def test_the_matrix_has_one_column_named_host(tmp_path: Path) -> None:
    page = render_html(_summary(tmp_path))
    head = page.split('<table id="matrix"><thead>', 1)[1].split("</thead>", 1)[0]
    assert head.count("<th>host</th>") == 1 and "<th>host layer</th>" in head


def test_an_attached_host_shows_how_it_was_reached(tmp_path: Path) -> None:
    path = make_verdict(tmp_path / "in", "attached", BROKEN, services=SERVICES)
    data = json.loads(path.read_text())
    data["connection"] = None  # `--attach URL`: no host access
    path.write_text(json.dumps(data))
    main(["merge", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "-q"])
    page = (tmp_path / "out" / "fleet-summary.html").read_text()
    assert "connection <code>none: attached by URL (http://127.0.0.1:30001)</code>" in page


def test_perf_deltas_are_coloured_by_direction_worse_first(tmp_path: Path) -> None:
    before = {"perf": {"dflash": {"output_throughput": 500.0, "p99_ttft_ms": 50.0}},
              "acceptance:dflash": {"accept_rate": 0.0008}}
    after = {"perf": {"dflash": {"output_throughput": 400.0, "p99_ttft_ms": 40.0}},
             "acceptance:dflash": {"accept_rate": 0.3747}}
    make_verdict(tmp_path / "n1", "gpu-a", GREEN, run_id="n1", finished=1796000000.0, metrics=before)
    main(["merge", str(tmp_path / "n1"), "--out", str(tmp_path / "out"), "-q"])
    make_verdict(tmp_path / "n2", "gpu-a", GREEN, run_id="n2", finished=1796086400.0, metrics=after)
    main(["merge", str(tmp_path / "n2"), "--out", str(tmp_path / "out"), "-q"])
    page = (tmp_path / "out" / "fleet-summary.html").read_text()
    table = page.split("<h3>Perf deltas", 1)[1].split("</table>", 1)[0]
    rows = table.split("<tr>")[2:]
    assert "perf.dflash.output_throughput" in rows[0] and '<td class="worse">-20.0% worse</td>' in rows[0]
    assert any("acceptance:dflash.accept_rate" in r and '<td class="good">+46737.5% better</td>' in r for r in rows)
    assert any("perf.dflash.p99_ttft_ms" in r and '<td class="good">-20.0% better</td>' in r for r in rows)
