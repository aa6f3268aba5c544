"""The perf runs of this process: one load run per (host, service), measured by the first test that needs it
and shared by the others, published into the host's verdict and the report directory.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_dflash.config.targets import file_name, service_file_name
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.parity.hooks import state_change_refusal
from pytest_dflash.layers.perf.judgement import Judgement
from pytest_dflash.layers.perf.judging import compare, comparison_pairs
from pytest_dflash.layers.perf.options import PerfOptions
from pytest_dflash.layers.perf.report import svg_plots
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.layers.perf.stats import bootstrap_bound, metric_sample
from pytest_dflash.layers.perf.sweep.book import SweepBook
from pytest_dflash.load.run import run_load
from pytest_dflash.run.handle import HandleHost, ServiceHandle
from pytest_dflash.run.state import HostContext
from pytest_dflash.services.events import Heartbeat

__all__ = ["PerfBook", "PerfItem", "host_of", "perf_file", "throughput_interval"]


def perf_file(report_dir: Path, host: str, service: str, suffix: str = ".json") -> Path:
    """``<report dir>/perf/<host>/<service><suffix>``: a service's perf JSON (``.json``) or a plot
    (``.latency_cdf.svg``, ...). Both names are made file names injectively (config/targets.py: the host as
    its verdict file names it, the service unchanged where a profile could name it), so two hosts or two
    services never share a file."""
    return report_dir / "perf" / file_name(host) / f"{service_file_name(service)}{suffix}"


@dataclass
class PerfItem:
    """What one test did with perf runs: the runs it used, the ones it measured (their plots go in
    its row)."""

    runs: list[ServiceRun] = field(default_factory=list)
    measured: list[ServiceRun] = field(default_factory=list)
    judgements: list[tuple[ServiceRun, Judgement]] = field(default_factory=list)
    # a sweep test's curve: its JUnit properties (a level each) and its lines for the report section
    properties: list[tuple[str, float]] = field(default_factory=list)
    sweep_lines: list[str] = field(default_factory=list)

    def use(self, run: ServiceRun) -> None:
        if run not in self.runs:
            self.runs.append(run)


class PerfBook:
    """Perf runs of this process, one per (host, service), shared by every perf test of the service."""

    def __init__(self, config: pytest.Config, options: PerfOptions) -> None:
        self.config = config
        self.options = options
        self.runs: dict[tuple[str, str], ServiceRun] = {}
        self.sweeps = SweepBook(load=self.load, settings=self.settings, report_dir=self.report_dir,
                                levels=options.sweep)

    def report_dir(self) -> Path:
        from pytest_dflash.run.stash import RUN_KEY

        return self.config.stash[RUN_KEY].options.report_dir

    def settings(self, handle: ServiceHandle) -> PerfSettings:
        return PerfSettings.resolve(handle.host.profile.perf, handle.name, self.options.overrides)

    def measure(self, handle: ServiceHandle, item: PerfItem) -> ServiceRun:
        key = (handle.host.name, handle.name)
        if key in self.runs:
            run = self.runs[key]
            item.use(run)
            return run
        run = self.load(handle, self.settings(handle))
        handle.host.run.progress(run.headline())
        self.runs[key] = run
        item.use(run)
        item.measured.append(run)
        self._compare(handle.host, run)
        self._write_plots(run)
        self.publish(handle.host, run)
        return run

    def load(self, handle: ServiceHandle, settings: PerfSettings) -> ServiceRun:
        """One load run of the service with `settings` (measured again while the client was saturated),
        neither kept nor published: `measure` keeps the service's run, a sweep (sweep/book.py) one a level."""
        progress = handle.host.run.progress
        model = handle.spec.model or "default"
        if settings.endpoint_for(handle.native) != "generate" and not handle.spec.model:
            try:
                model = handle.client.model()
            except ApiError:
                model = "default"
        headers = {}
        if handle.spec.api_key_env and os.environ.get(handle.spec.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[handle.spec.api_key_env]}"
        progress(f"{handle.label}: perf run ({settings.describe(handle.native)})")
        refusal = state_change_refusal(handle, allowed=self.options.allow_state_changes)

        def so_far(done: int, failed: int, tokens: int, seconds: float) -> None:
            progress(Heartbeat(f"{handle.label}: perf run so far: {done} requests ({failed} failed), "
                               f"{tokens / max(seconds, 1e-9):,.0f} tok/s, {seconds:.0f}s"))

        return ServiceRun.measure(host=handle.host.name, service=handle.name, algorithm=handle.algorithm,
                                  url=handle.url, settings=settings, native=handle.native, model=model,
                                  headers=headers, say=progress, flush_refused=refusal,
                                  runner=functools.partial(run_load, so_far=so_far))

    def _compare(self, host: HandleHost, run: ServiceRun) -> None:
        """Speed-ups between this run and the host's other runs (DDTREE vs DFLASH vs NONE)."""
        peers = {name: r for (h, name), r in self.runs.items() if h == host.name}
        for faster, slower in comparison_pairs({name: r.algorithm for name, r in peers.items()}):
            if run.service not in (faster, slower):
                continue
            comparison = compare(peers[faster], peers[slower])
            if comparison is not None:
                peers[faster].comparisons[slower] = comparison
                if peers[faster] is not run:
                    self.publish(host, peers[faster])

    def publish(self, host: HandleHost, run: ServiceRun) -> None:
        """Numbers into the verdict (host.facts.metrics), the per-service JSON under the report dir."""
        host.facts.metrics.update(run.metrics())
        host.facts.metrics.update(throughput_interval(run))
        if run.accept_length is not None:
            host.facts.accept_lengths[run.service] = round(run.accept_length, 4)
        run.write(perf_file(self.report_dir(), host.name, run.service))

    def _write_plots(self, run: ServiceRun) -> None:
        for name, svg in svg_plots(run).items():
            path = perf_file(self.report_dir(), run.host, run.service, f".{name}.svg")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(svg, encoding="utf-8")


def throughput_interval(run: ServiceRun) -> dict[str, float]:
    """`perf.<service>.output_throughput.lower/.upper`: the bootstrap bounds (each one-sided at 95%) of this
    run's output tok/s, the spread the fleet trend judges a throughput change against (fleet/trend.py): the
    floor judgement's when there is one, else computed here. {} when the run has no successful request."""
    judged = run.judgements.get("output_tok_s")
    lower, upper = (judged.lower, judged.upper) if judged is not None else (None, None)
    if lower is None or upper is None:
        try:
            bound = bootstrap_bound(metric_sample(run.result, "output_tok_s"))
        except ValueError:
            return {}
        lower, upper = bound.lower, bound.upper
    if not (math.isfinite(lower) and math.isfinite(upper)):
        return {}
    prefix = f"perf.{run.service}.output_throughput"
    return {f"{prefix}.lower": round(lower, 4), f"{prefix}.upper": round(upper, 4)}


def host_of(run: ServiceRun, book: PerfBook) -> HostContext | None:
    from pytest_dflash.run.stash import RUN_KEY

    dflash_run = book.config.stash.get(RUN_KEY, None)
    if dflash_run is None or run.host not in dflash_run.profiles:
        return None
    return dflash_run.host(run.host)
