"""One table across services, as GuideLLM prints one across benchmarks: per service its output tok/s, TTFT and
ITL p50 / p99, accept length and speed-up, in the pytest-html report (each perf test's services) and in
fleet-summary.html (every host's services, failing hosts first).

    html = perf_table([PerfRow(host="h200", service="dflash", algorithm="DFLASH", output_tok_s=514.9, ...)])
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["COLUMNS", "PerfRow", "perf_table", "rows_from_metrics"]

# (header, PerfRow field, digits)
COLUMNS = (("output tok/s", "output_tok_s", 1), ("TTFT p50 (ms)", "ttft_p50_ms", 1),
           ("TTFT p99 (ms)", "ttft_p99_ms", 1), ("ITL p50 (ms)", "itl_p50_ms", 2),
           ("ITL p99 (ms)", "itl_p99_ms", 2),
           ("accept length", "accept_length", 3))
CSS = ("table.dflash-perf-table{border-collapse:collapse;margin:.4em 0}"
       "table.dflash-perf-table th,table.dflash-perf-table td{border:1px solid #ccc;padding:3px 8px;"
       "color:#222}"
       "table.dflash-perf-table th{background:#f0f0f0;text-align:left}"
       "table.dflash-perf-table td.n{text-align:right;font-variant-numeric:tabular-nums}"
       "table.dflash-perf-table tr.fail td:first-child{border-left:4px solid #c62828}")


@dataclass(frozen=True, kw_only=True)
class PerfRow:
    """One service's measured numbers (None: not measured)."""

    host: str
    service: str
    algorithm: str = ""
    failing: bool = False
    output_tok_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    accept_length: float | None = None
    speedups: dict[str, float] = field(default_factory=dict)  # {versus service: output tok/s ratio}


def _number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None  # type: ignore[arg-type]


def rows_from_metrics(host: str, metrics: Mapping[str, float], algorithms: Mapping[str, str], *,
                      failing: bool = False) -> list[PerfRow]:
    """The rows of one host from its verdict's flattened metrics (`perf.<service>.output_throughput` …)."""
    services = sorted({key.split(".")[1] for key in metrics
                       if key.startswith("perf.") and key.count(".") >= 2})
    rows = []
    for service in services:
        def get(name: str, service: str = service) -> float | None:
            return _number(metrics.get(f"perf.{service}.{name}"))

        if get("output_throughput") is None:
            continue
        prefix = f"perf.{service}.speedup_vs_"
        speedups = {key.removeprefix(prefix): float(value) for key, value in metrics.items()
                    if key.startswith(prefix) and "." not in key.removeprefix(prefix)}
        rows.append(PerfRow(host=host, service=service, algorithm=algorithms.get(service, ""),
                            failing=failing, output_tok_s=get("output_throughput"),
                            ttft_p50_ms=get("median_ttft_ms"), ttft_p99_ms=get("p99_ttft_ms"),
                            itl_p50_ms=get("median_itl_ms"), itl_p99_ms=get("p99_itl_ms"),
                            accept_length=get("accept_length"), speedups=speedups))
    return rows


def perf_table(rows: Sequence[PerfRow], *, hosts: bool = True) -> str:
    """The table (with its own CSS); failing hosts' rows first and marked; '' for no rows."""
    if not rows:
        return ""
    ordered = sorted(rows, key=lambda r: (not r.failing, r.host, r.service))
    head = ("<th>host</th>" if hosts else "") + "<th>service</th><th>algorithm</th>" + "".join(
        f"<th>{html.escape(title)}</th>" for title, _, _ in COLUMNS) + "<th>speed-up (output tok/s)</th>"
    body = []
    for row in ordered:
        cells = "".join(
            f'<td class="n">{"" if (v := getattr(row, name)) is None else f"{v:.{digits}f}"}</td>'
            for _, name, digits in COLUMNS)
        speedup = ", ".join(f"{point:.2f}x vs {html.escape(versus)}"
                            for versus, point in sorted(row.speedups.items()))
        host = f"<td>{html.escape(row.host)}</td>" if hosts else ""
        body.append(f'<tr class="{"fail" if row.failing else "pass"}">{host}'
                    f"<td>{html.escape(row.service)}</td><td>{html.escape(row.algorithm)}</td>{cells}"
                    f"<td>{speedup}</td></tr>")
    return (f'<style>{CSS}</style><table class="dflash-perf-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")
