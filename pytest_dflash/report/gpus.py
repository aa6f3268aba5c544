"""The GPU x service matrix of a multi-GPU host, as HTML: every GPU nvidia-smi listed, the services the
profile puts on it, and what the host layer found wrong with it (facts.gpu_matrix, layers/gpu/host.py). A bad
GPU's row says which services it blocked; the others show the services that went on."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

BAD = "#c0392b"
GOOD = "#1e8449"


def gpu_matrix_table(host: str, matrix: Mapping[str, Any]) -> str:
    """One host's matrix (GPU index -> {gpu, services, problems}) as a table; '' when it has none."""
    if not matrix:
        return ""
    rows = []
    for index in sorted(matrix, key=lambda key: int(key) if str(key).isdigit() else 1 << 30):
        entry = matrix[index] if isinstance(matrix[index], Mapping) else {}
        services = ", ".join(str(s) for s in entry.get("services") or []) or "—"
        problems = [str(p) for p in entry.get("problems") or []]
        state = (f'<td style="color:{BAD};font-weight:bold">bad: {html.escape("; ".join(problems))}'
                 f"{' (blocks ' + html.escape(services) + ')' if services != '—' else ''}</td>"
                 if problems else f'<td style="color:{GOOD}">ok</td>')
        label = html.escape(str(entry.get("gpu", index)))
        rows.append(f'<tr data-gpu="{html.escape(str(index))}"><td>{label}</td>'
                    f"<td>{html.escape(services)}</td>{state}</tr>")
    name = html.escape(host)
    return (f'<table class="dflash-gpu-matrix" data-host="{name}"><caption>{name}: GPU x service</caption>'
            "<tr><th>GPU</th><th>services</th><th>host layer</th></tr>" + "".join(rows) + "</table>")


def gpu_matrix_section(hosts: Mapping[str, Mapping[str, Any]]) -> str:
    """Every host's matrix (host -> its verdict facts) under one heading; '' when no host has one."""
    tables = [gpu_matrix_table(name, facts.get("gpu_matrix") or {}) for name, facts in sorted(hosts.items())]
    tables = [t for t in tables if t]
    return "<h2>dflash GPUs</h2>" + "".join(tables) if tables else ""
