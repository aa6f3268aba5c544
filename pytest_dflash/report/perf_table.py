"""One table across services, as GuideLLM prints one across benchmarks: per service its output tok/s, req/s,
TTFT, ITL and end-to-end latency p50 / p99, accept length (the client's, which the headline states and the
check judges, and the server's own, each labelled) and speed-up, in the pytest-html report (each perf test's
services) and in fleet-summary.html (every host's services, failing hosts first).

    html = perf_table([PerfRow(host="h200", service="dflash", algorithm="DFLASH", output_tok_s=514.9, ...)])
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["COLUMNS", "PerfRow", "perf_table", "rows_from_metrics"]

# (header, PerfRow field, digits)
COLUMNS = (("output tok/s", "output_tok_s", 1), ("req/s", "request_per_s", 2),
           ("TTFT p50 (ms)", "ttft_p50_ms", 1), ("TTFT p99 (ms)", "ttft_p99_ms", 1),
           ("ITL p50 (ms)", "itl_p50_ms", 2), ("ITL p99 (ms)", "itl_p99_ms", 2),
           ("e2e p50 (ms)", "e2e_p50_ms", 1), ("e2e p99 (ms)", "e2e_p99_ms", 1),
           ("accept length, client (judged)", "accept_length", 3),
           ("accept length, server-reported", "server_accept_length", 3))
# the header's tooltip: where each number comes from
TIPS = {"request_per_s": "completed requests per second of the run",
        "e2e_p50_ms": "end-to-end latency of a request: from sending it to its last token",
        "e2e_p99_ms": "end-to-end latency of a request: from sending it to its last token",
        "accept_length": "Σ output tokens / Σ verify steps of the run's requests (their meta_info): the "
                         "number the headline states and the accept-length check judges",
        "server_accept_length": "the server's own accept length (its /metrics or /server_info), shown beside "
                                "the client's, not judged"}
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
    request_per_s: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    accept_length: float | None = None  # the client's: the one the headline states and the check judges
    server_accept_length: float | None = None
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
                            request_per_s=get("request_throughput"), e2e_p50_ms=get("median_e2e_latency_ms"),
                            e2e_p99_ms=get("p99_e2e_latency_ms"), accept_length=get("accept_length"),
                            server_accept_length=get("server_accept_length"), speedups=speedups))
    return rows


def perf_table(rows: Sequence[PerfRow], *, hosts: bool = True) -> str:
    """The table (with its own CSS); failing hosts' rows first and marked; '' for no rows."""
    if not rows:
        return ""
    ordered = sorted(rows, key=lambda r: (not r.failing, r.host, r.service))
    # a column no row has (no server accept length anywhere) is left out, not shown blank
    columns = [c for c in COLUMNS if any(getattr(row, c[1]) is not None for row in rows)
               or c[1] in ("output_tok_s", "accept_length")]
    head = ("<th>host</th>" if hosts else "") + "<th>service</th><th>algorithm</th>" + "".join(
        f'<th data-column="{name}"{_tip(name)}>{html.escape(title)}</th>' for title, name, _ in columns
    ) + "<th>speed-up (output tok/s)</th>"
    body = []
    for row in ordered:
        cells = "".join(
            f'<td class="n">{"" if (v := getattr(row, name)) is None else f"{v:.{digits}f}"}</td>'
            for _, name, digits in columns)
        speedup = ", ".join(f"{point:.2f}x vs {html.escape(versus)}"
                            for versus, point in sorted(row.speedups.items()))
        host = f"<td>{html.escape(row.host)}</td>" if hosts else ""
        body.append(f'<tr class="{"fail" if row.failing else "pass"}">{host}'
                    f"<td>{html.escape(row.service)}</td><td>{html.escape(row.algorithm)}</td>{cells}"
                    f"<td>{speedup}</td></tr>")
    return (f'<style>{CSS}</style><table class="dflash-perf-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _tip(name: str) -> str:
    return f' title="{html.escape(TIPS[name])}"' if name in TIPS else ""
