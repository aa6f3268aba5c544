"""Prometheus exposition of a fleet summary, through prometheus_client: a node_exporter textfile and a
Pushgateway push.

    pytest --fleet hosts/ suites/smoke -n auto --prometheus /var/lib/node_exporter/textfile/dflash.prom
    pytest-dflash merge shards/ --out fleet/ --prometheus /var/lib/node_exporter/textfile/dflash.prom
    pytest-dflash merge shards/ --out fleet/ --prometheus-push http://pushgateway:9091/metrics/job/dflash-nightly

`Exposition` is a prometheus_client collector: the text is prometheus_client's `generate_latest`, the push
its `push_to_gateway` (PUT: the pushed group is replaced as a whole). Only gauges, no sample timestamps (the
textfile collector rejects them). Metric names are listed in `METRICS` and in docs/fleet.md.

The textfile is still written by `files.atomic_write`, not `prometheus_client.write_to_textfile`:
the latter neither fsyncs before the rename (a crash can leave an empty `.prom` in place of the last good
one), nor sets the mode (a 0600 umask hides the file from node_exporter), nor creates the folder.
"""

from __future__ import annotations

import base64
import math
import re
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest, push_to_gateway
from prometheus_client.metrics_core import Metric

from pytest_dflash.client.deadline import bound_total_time, deadline
from pytest_dflash.errors import ApiError
from pytest_dflash.files import atomic_write
from pytest_dflash.fleet.values import crossovers, measurements, sweep_samples
from pytest_dflash.scrub.bounds import clip

NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
PUSH_JOB = "pytest-dflash"  # the Pushgateway job when the URL names none
PUSH_TIMEOUT_S = 10.0

# name -> help. Every family is a gauge.
METRICS: dict[str, str] = {
    "dflash_fleet_hosts": "hosts in the fleet summary, by verdict",
    "dflash_fleet_gate_pass": "1 if the gated layers passed on every host of the summary, else 0 "
                              "(absent without a gate)",
    "dflash_fleet_summary_timestamp_seconds": "when the fleet summary was written (unix time)",
    "dflash_host_pass": "1 if the host's verdict is pass (no layer failed or was blocked), else 0",
    "dflash_host_run_timestamp_seconds": "when the run that produced the host's verdict finished (unix time)",
    "dflash_host_run_duration_seconds": "duration of the run that produced the host's verdict",
    "dflash_host_failing_since_timestamp_seconds": "for a failing host: first run of its current failing "
                                                   "streak",
    "dflash_host_last_good_timestamp_seconds": "when the host last had a passing verdict (unix time)",
    "dflash_host_failed_tests": "failed (or errored) tests of the host",
    "dflash_host_blocked_tests": "tests of the host skipped because a lower layer failed",
    "dflash_layer_outcome": "1 for the layer's outcome on the host (passed, failed, blocked, skipped); "
                            "layers that did not run are absent",
    "dflash_failure_diagnosis": "1 per host, layer and diagnosis id of a failure (diagnosis=\"none\" when no "
                                "catalog signature matched)",
    "dflash_service_info": "1 per service, with its speculative algorithm and the server version it reported",
    "dflash_service_ready_seconds": "seconds from launch/attach until the service was ready (greedy + "
                                    "sampled generation succeeded)",
    "dflash_service_accept_length": "mean accept length measured on the service (speculative decoding)",
    "dflash_perf": "a measured number of the host (the verdict's metrics, no thresholds), by metric name",
    "dflash_perf_sweep": "a load sweep's measured number, per service, concurrency level and metric "
                         "(output_tok_s, goodput_req_s, ttft_p99_ms, speedup_vs_<twin>, ...)",
    "dflash_perf_crossover_concurrency": "the lowest concurrency at which a speculative service is "
                                         "confidently slower than its plain twin (absent: no crossover "
                                         "within the sweep)",
}


def escape_label(value: str) -> str:
    """A label value as the text format writes it (what prometheus_client does, for tools and tests)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    """A sample value in its shortest exact form (1, 0.5, NaN, +Inf, 1e+20), as a person would write it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    name: str
    help: str
    samples: dict[Labels, float] = field(default_factory=dict)


class Exposition:
    """A prometheus_client collector of gauge families in insertion order; each sample's label set is unique
    within its family (the first value wins: a duplicate series would make the whole file invalid)."""

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
        family.samples.setdefault(tuple((k, str(v)) for k, v in labels.items()), float(value))

    def collect(self) -> Iterator[Metric]:
        for family in self.families.values():
            metric = Metric(family.name, family.help, "gauge")
            for labels, value in family.samples.items():
                metric.add_sample(family.name, dict(labels), value)
            yield metric

    def registry(self) -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def render(self) -> str:
        return generate_latest(self.registry()).decode("utf-8")


def write_textfile(path: Path, text: str) -> None:
    """Atomic replace (node_exporter must never read half a file): see files.atomic_write."""
    atomic_write(path, text)


def fleet_exposition(summary: Mapping[str, Any]) -> str:
    """The textfile of a fleet summary (pytest_dflash.fleet.summary.build_summary)."""
    return fleet_metrics(summary).render()


def fleet_metrics(summary: Mapping[str, Any]) -> Exposition:
    """The metrics of a fleet summary."""
    out = Exposition()
    hosts: Mapping[str, Mapping[str, Any]] = summary.get("hosts", {})
    totals = summary.get("totals", {})
    out.add("dflash_fleet_hosts", {"verdict": "pass"}, totals.get("pass", 0))
    out.add("dflash_fleet_hosts", {"verdict": "fail"}, totals.get("fail", 0))
    gate = summary.get("gate")
    if gate:
        out.add("dflash_fleet_gate_pass", {"layers": ",".join(gate.get("layers", []))},
                1 if gate.get("passed") else 0)
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
        out.add("dflash_host_blocked_tests", base,
                sum(int(b.get("count", 1)) for b in host.get("blocked", [])))
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
        for metric, value in measurements(host.get("metrics", {})).items():  # thresholds stay out
            _maybe(out, "dflash_perf", {"host": name, "metric": metric}, value)
    for name, host in hosts.items():
        metrics = host.get("metrics", {})
        for service, level, metric, value in sweep_samples(metrics):
            _maybe(out, "dflash_perf_sweep",
                   {"host": name, "service": service, "level": str(level), "metric": metric}, value)
        for service, versus, level_value in crossovers(metrics):
            _maybe(out, "dflash_perf_crossover_concurrency",
                   {"host": name, "service": service, "versus": versus}, level_value)
    return out


def _maybe(out: Exposition, name: str, labels: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        out.add(name, labels, float(value))


class PushError(Exception):
    """The Pushgateway could not be reached or refused the push (one line, credentials masked)."""


def push(url: str, summary: Mapping[str, Any], *, timeout_s: float = PUSH_TIMEOUT_S) -> str:
    """PUT the fleet summary's metrics to a Pushgateway; returns the group URL pushed to (credentials masked).

    `url` is the gateway (`http://pgw:9091`, job `pytest-dflash`) or a group URL in the Pushgateway's own
    form, `http://pgw:9091/metrics/job/<job>[/<label>/<value>]...` (one group per shard: `.../shard/2`),
    optionally with `user:password@` for basic auth. Raises PushError."""
    gateway, job, grouping, auth, shown = _push_target(url)
    try:
        push_to_gateway(gateway, job=job, registry=fleet_metrics(summary).registry(), grouping_key=grouping,
                        timeout=timeout_s, handler=_bounded_handler(auth))
    except OSError as exc:  # urllib's URLError / HTTPError, refused connections and timeouts are all OSErrors
        reason = getattr(exc, "reason", None) or exc
        status = f"HTTP {exc.code} " if hasattr(exc, "code") and isinstance(exc.code, int) else ""
        raise PushError(f"{shown}: {status}{_one_line(str(reason))}") from None
    except ValueError as exc:
        raise PushError(f"{shown}: {_one_line(str(exc))}") from None
    return shown


PushHandler = Callable[[str, str, float | None, list[tuple[str, str]], bytes], Callable[[], None]]


def _bounded_handler(auth: tuple[str, str] | None) -> PushHandler:
    """prometheus_client's push handler, over an httpx client whose whole call is bounded by the push's
    timeout: urllib's (the default handler's) timeout is per socket operation, so a gateway that drips its
    answer a header at a time held a push, and the run or merge after it, for ever."""
    def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                data: bytes) -> Callable[[], None]:
        def send() -> None:
            sent = dict(headers)
            if auth is not None:
                sent["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            limit = timeout if timeout is not None else PUSH_TIMEOUT_S
            try:
                with bound_total_time(httpx.Client(timeout=limit)) as client, deadline(limit), \
                        client.stream(method, url, headers=sent, content=data) as response:
                    status, reason = response.status_code, response.reason_phrase
            except httpx.TimeoutException:
                raise OSError(f"timed out (the push's total time, {limit:g}s)") from None
            except (httpx.HTTPError, ApiError) as exc:
                raise OSError(str(exc) or type(exc).__name__) from None
            if status >= 400:
                raise urllib.error.HTTPError(url, status, reason, None, None)  # type: ignore[arg-type]
        return send
    return handler


def check_push_url(url: str) -> str:
    """The URL a --prometheus-push value pushes to (credentials masked); raises PushError on a malformed
    one."""
    return _push_target(url)[4]


def _push_target(url: str) -> tuple[str, str, dict[str, str], tuple[str, str] | None, str]:
    """(gateway, job, grouping key, basic auth, URL to show) of a --prometheus-push value."""
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PushError(f"{url!r}: expected a Pushgateway URL like http://pushgateway:9091[/metrics/job/NAME]")
    try:
        port = parsed.port
    except ValueError:
        raise PushError(f"{url!r}: expected a numeric port") from None
    host = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
    netloc = f"{host}:{port}" if port else host
    auth = None
    if parsed.username is not None:
        auth = (urllib.parse.unquote(parsed.username), urllib.parse.unquote(parsed.password or ""))
    parts = [urllib.parse.unquote(p) for p in parsed.path.split("/") if p]
    job, grouping = PUSH_JOB, {}
    if parts:
        if "metrics" not in parts:
            raise PushError(f"{url!r}: expected the gateway or .../metrics/job/NAME[/LABEL/VALUE]..., got "
                            f"path {parsed.path!r}")
        at = parts.index("metrics")
        rest = parts[at + 1:]
        if len(rest) < 2 or len(rest) % 2 or rest[0] not in ("job", "job@base64"):
            raise PushError(f"{url!r}: expected .../metrics/job/NAME[/LABEL/VALUE]... after the gateway")
        job = _decode(rest[0], rest[1])
        pairs = zip(rest[2::2], rest[3::2], strict=True)
        grouping = {key.removesuffix("@base64"): _decode(key, value) for key, value in pairs}
        prefix = "/" + "/".join(parts[:at])
        netloc += prefix if prefix != "/" else ""
    gateway = f"{parsed.scheme}://{netloc}"
    shown = f"{parsed.scheme}://{'***@' if auth else ''}{netloc}/metrics/job/{job}" + "".join(
        f"/{key}/{value}" for key, value in grouping.items())
    return gateway, job, grouping, auth, shown


def _decode(key: str, value: str) -> str:
    if not key.endswith("@base64"):
        return value
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode("utf-8")
    except ValueError:
        raise PushError(f"{key}/{value}: not URL-safe base64") from None


def _one_line(text: str) -> str:
    return clip(" ".join(text.split()), 300) or "no reason given"
