"""Prometheus text exposition (node_exporter textfile-collector format) of a fleet summary.

    pytest --fleet hosts/ suites/smoke -n auto --prometheus /var/lib/node_exporter/textfile/dflash.prom
    pytest-dflash merge shards/ --out fleet/ --prometheus /var/lib/node_exporter/textfile/dflash.prom

The file is written atomically (a temporary file in the same folder, then rename), so the collector never
reads half a file; the temporary name does not end in `.prom`, so the collector ignores it. Only gauges,
no sample timestamps (the textfile collector rejects them). Metric names are listed in `METRICS` and in
docs/fleet.md; every family has HELP and TYPE lines, label values are escaped (\\ " and newline).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_dflash.report.files import atomic_write

NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# name -> help. Every family is a gauge.
METRICS: dict[str, str] = {
    "dflash_fleet_hosts": "hosts in the fleet summary, by verdict",
    "dflash_fleet_gate_pass": "1 if the gated layers passed on every host of the summary, else 0 "
                              "(absent without a gate)",
    "dflash_fleet_summary_timestamp_seconds": "when the fleet summary was written (unix time)",
    "dflash_host_pass": "1 if the host's verdict is pass (no layer failed or was blocked), else 0",
    "dflash_host_run_timestamp_seconds": "when the run that produced the host's verdict finished (unix time)",
    "dflash_host_run_duration_seconds": "duration of the run that produced the host's verdict",
    "dflash_host_failing_since_timestamp_seconds": "for a failing host: first run of its current failing streak",
    "dflash_host_last_good_timestamp_seconds": "when the host last had a passing verdict (unix time)",
    "dflash_host_failed_tests": "failed (or errored) tests of the host",
    "dflash_host_blocked_tests": "tests of the host skipped because a lower layer failed",
    "dflash_layer_outcome": "1 for the layer's outcome on the host (passed, failed, blocked, skipped); "
                            "layers that did not run are absent",
    "dflash_failure_diagnosis": "1 per host, layer and diagnosis id of a failure (diagnosis=\"none\" when no "
                                "catalog signature matched)",
    "dflash_service_info": "1 per service, with its speculative algorithm and the server version it reported",
    "dflash_service_ready_seconds": "seconds from launch/attach until the service was ready (greedy + sampled "
                                    "generation succeeded)",
    "dflash_service_accept_length": "mean accept length measured on the service (speculative decoding)",
    "dflash_perf": "a perf-layer number of the host (from the verdict's metrics), by metric name",
}


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


@dataclass
class Family:
    name: str
    help: str
    samples: list[tuple[tuple[tuple[str, str], ...], float]] = field(default_factory=list)


class Exposition:
    """Families in insertion order; each sample's label set is unique within its family."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def add(self, name: str, labels: Mapping[str, Any], value: float) -> None:
        if name not in METRICS:
            raise KeyError(f"undocumented metric {name}")
        if not NAME_RE.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for key in labels:
            if not LABEL_RE.match(key) or key.startswith("__"):
                raise ValueError(f"invalid label name {key!r}")
        family = self.families.setdefault(name, Family(name, METRICS[name]))
        family.samples.append((tuple((k, str(v)) for k, v in labels.items()), float(value)))

    def render(self) -> str:
        lines: list[str] = []
        for family in self.families.values():
            lines.append(f"# HELP {family.name} {escape_help(family.help)}")
            lines.append(f"# TYPE {family.name} gauge")
            seen: set[tuple[tuple[str, str], ...]] = set()
            for labels, value in family.samples:
                if labels in seen:
                    continue  # a duplicate series would make the whole file invalid
                seen.add(labels)
                text = ",".join(f'{key}="{escape_label(val)}"' for key, val in labels)
                lines.append(f"{family.name}{{{text}}} {format_value(value)}" if text
                             else f"{family.name} {format_value(value)}")
        return "\n".join(lines) + "\n"


def write_textfile(path: Path, text: str) -> None:
    """Atomic replace (node_exporter must never read half a file): see files.atomic_write."""
    atomic_write(path, text)


def fleet_exposition(summary: Mapping[str, Any]) -> str:
    """The textfile of a fleet summary (pytest_dflash.fleet.summary.build_summary)."""
    out = Exposition()
    hosts: Mapping[str, Mapping[str, Any]] = summary.get("hosts", {})
    totals = summary.get("totals", {})
    out.add("dflash_fleet_hosts", {"verdict": "pass"}, totals.get("pass", 0))
    out.add("dflash_fleet_hosts", {"verdict": "fail"}, totals.get("fail", 0))
    gate = summary.get("gate")
    if gate:
        out.add("dflash_fleet_gate_pass", {"layers": ",".join(gate.get("layers", []))}, 1 if gate.get("passed") else 0)
    out.add("dflash_fleet_summary_timestamp_seconds", {}, float(summary.get("generated_ts", 0.0)))
    for name, host in hosts.items():
        base = {"host": name}
        out.add("dflash_host_pass", base, 1 if host.get("verdict") == "pass" else 0)
        _maybe(out, "dflash_host_run_timestamp_seconds", base, host.get("finished_ts"))
        _maybe(out, "dflash_host_run_duration_seconds", base, host.get("duration_s"))
        _maybe(out, "dflash_host_failing_since_timestamp_seconds", base, host.get("failing_since_ts"))
        last_good = host.get("last_good") or {}
        _maybe(out, "dflash_host_last_good_timestamp_seconds", base, last_good.get("finished_ts"))
        out.add("dflash_host_failed_tests", base, len(host.get("failures", [])))
        out.add("dflash_host_blocked_tests", base, sum(int(b.get("count", 1)) for b in host.get("blocked", [])))
    for name, host in hosts.items():
        for layer, outcome in host.get("layers", {}).items():
            if outcome != "not-run":
                out.add("dflash_layer_outcome", {"host": name, "layer": layer, "outcome": outcome}, 1)
    for name, host in hosts.items():
        for failure in host.get("failures", []):
            ids = [d.get("id", "") for d in failure.get("diagnosis", [])] or ["none"]
            for diagnosis in ids:
                out.add("dflash_failure_diagnosis", {"host": name, "layer": failure.get("layer", ""),
                                                     "diagnosis": diagnosis}, 1)
    for name, host in hosts.items():
        for service, facts in host.get("services", {}).items():
            labels = {"host": name, "service": service, "algorithm": str(facts.get("algorithm") or "")}
            out.add("dflash_service_info", {**labels, "version": str(facts.get("version") or "")}, 1)
            _maybe(out, "dflash_service_ready_seconds", labels, facts.get("ready_s"))
            _maybe(out, "dflash_service_accept_length", labels, facts.get("accept_length"))
    for name, host in hosts.items():
        for metric, value in host.get("metrics", {}).items():
            _maybe(out, "dflash_perf", {"host": name, "metric": metric}, value)
    return out.render()


def _maybe(out: Exposition, name: str, labels: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        out.add(name, labels, float(value))


def samples_of(text: str) -> Iterable[str]:
    """The sample lines of an exposition (for quick greps in tools and tests)."""
    return (line for line in text.splitlines() if line and not line.startswith("#"))
