"""pytest hooks of the perf layer: its options, the `dflash_perf` fixture, plots in the HTML row, the summary.

Registered through pytest_dflash.plugin.pytest_plugins. Every option is also an ini key (dflash_ prefix).

    pytest --host local suites/perf
    pytest --host ct200 suites/perf --update-baseline          # record this (good) run as the baseline
    pytest --host ct200 suites/perf --perf-requests 800 --html reports/perf.html
"""

from __future__ import annotations

import functools
import html
import math
import os
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.client.sampling import Sampling
from pytest_dflash.config import options
from pytest_dflash.errors import ApiError
from pytest_dflash.layers.generation.checks import PROMPT, Api, request_stream
from pytest_dflash.layers.parity.acceptance import check_floor
from pytest_dflash.layers.parity.checks import measure_acceptance
from pytest_dflash.layers.parity.hooks import allow_state_changes, state_change_refusal
from pytest_dflash.layers.perf.layer import (
    NOT_PASSING,
    Judgement,
    PerfOverrides,
    PerfSettings,
    ServiceRun,
    baseline_path,
    compare,
    comparison_pairs,
    confidence_of,
    judge_accept_length,
    judge_baseline,
    judge_floors,
    judge_speedup,
    load_baseline,
    safe_name,
    save_baseline,
)
from pytest_dflash.layers.perf.token_latency import (
    judge_token_latency,
    stream_token_latency,
    token_latency_ceiling,
)
from pytest_dflash.load.run import run_load
from pytest_dflash.load.workload import BUILTIN_NAME, DatasetError, dataset_path, load_dataset
from pytest_dflash.run.state import HostContext, ServiceHandle
from pytest_dflash.services.events import Heartbeat

INCONCLUSIVE_HINT = ("INCONCLUSIVE is not a pass: the test fails and a --gate with perf does not pass. Measure longer: "
                     "--perf-requests {requests} (or [perf] requests in the profile).")
REFUSED_HINT = ("REFUSED: the load client was the bottleneck, so nothing was judged. Run the client on a quieter "
                "machine, lower [perf] concurrency, or raise [perf] max_loop_lag_ms / max_client_cpu.")


@dataclass(frozen=True)
class PerfOptions:
    update_baseline: bool = False
    baseline_dir: Path = Path("reports/baselines")
    overrides: PerfOverrides = field(default_factory=PerfOverrides)
    allow_state_changes: bool = False  # --allow-state-changes (declared by the parity layer's hooks)
    tpot_ceiling_ms: float | None = None  # --tpot-ceiling-ms; None: the default / the profile's
    tpot_ceiling_off: bool = False


OPTIONS_KEY = pytest.StashKey[PerfOptions]()
BOOK_KEY = pytest.StashKey["PerfBook"]()
ITEM_KEY = pytest.StashKey["PerfItem"]()


def _ceiling(config: pytest.Config) -> tuple[float | None, bool]:
    raw = options.text(config, "dflash_tpot_ceiling_ms")
    if not raw:
        return None, False
    if raw.lower() in ("off", "none", "no"):
        return None, True
    try:
        value = float(raw.removesuffix("ms"))
    except ValueError:
        raise pytest.UsageError(f"{options.where('dflash_tpot_ceiling_ms')}: {raw!r} is not a number of milliseconds "
                                "(or 'off')") from None
    if not value > 0:
        raise pytest.UsageError(f"{options.where('dflash_tpot_ceiling_ms')}: {raw!r} must be > 0")
    return value, False


def _dataset(config: pytest.Config) -> str | None:
    """--perf-dataset PATH (or 'builtin'), read and checked now: a bad file is a one-line usage error."""
    raw = options.text(config, "dflash_perf_dataset")
    if not raw:
        return None
    path = dataset_path(raw) if raw == BUILTIN_NAME else options.path(config, "dflash_perf_dataset")
    assert path is not None
    try:
        load_dataset(path)
    except DatasetError as exc:
        raise pytest.UsageError(f"{options.where('dflash_perf_dataset')}: {exc}") from None
    return str(path.resolve())


def options_from_config(config: pytest.Config) -> PerfOptions:
    ceiling, ceiling_off = _ceiling(config)
    return PerfOptions(
        update_baseline=options.flag(config, "dflash_update_baseline"),
        baseline_dir=options.path(config, "dflash_baseline_dir") or config.invocation_params.dir / "reports/baselines",
        overrides=PerfOverrides(
            requests=options.number(config, "dflash_perf_requests", int, None, low=1),
            duration_s=options.duration(config, "dflash_perf_duration", None),
            concurrency=options.number(config, "dflash_perf_concurrency", int, None, low=1),
            warmup=options.number(config, "dflash_perf_warmup", int, None, low=0),
            client_procs=options.number(config, "dflash_perf_client_procs", int, None, low=1),
            dataset=_dataset(config),
        ),
        allow_state_changes=allow_state_changes(config),
        tpot_ceiling_ms=ceiling,
        tpot_ceiling_off=ceiling_off,
    )


def pytest_configure(config: pytest.Config) -> None:
    perf_options = options_from_config(config)
    config.stash[OPTIONS_KEY] = perf_options
    config.stash[BOOK_KEY] = PerfBook(config, perf_options)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(PerfSummary(), "dflash-perf-summary")


# ---- the fixture -----------------------------------------------------------------------------------------


@dataclass
class PerfItem:
    """What one test did with perf runs: the runs it used, the ones it measured (their plots go in its row)."""

    runs: list[ServiceRun] = field(default_factory=list)
    measured: list[ServiceRun] = field(default_factory=list)
    judgements: list[tuple[ServiceRun, Judgement]] = field(default_factory=list)

    def use(self, run: ServiceRun) -> None:
        if run not in self.runs:
            self.runs.append(run)


class PerfBook:
    """Perf runs of this process, one per (host, service), shared by every perf test of the service."""

    def __init__(self, config: pytest.Config, options: PerfOptions) -> None:
        self.config = config
        self.options = options
        self.runs: dict[tuple[str, str], ServiceRun] = {}

    def report_dir(self, host: str) -> Path:
        from pytest_dflash.run.stash import RUN_KEY

        run = self.config.stash[RUN_KEY]
        return run.options.report_dir / "perf" / safe_name(host)

    def settings(self, handle: ServiceHandle) -> PerfSettings:
        return PerfSettings.resolve(handle.host.profile.perf, handle.name, self.options.overrides)

    def measure(self, handle: ServiceHandle, item: PerfItem) -> ServiceRun:
        key = (handle.host.name, handle.name)
        if key in self.runs:
            run = self.runs[key]
            item.use(run)
            return run
        settings = self.settings(handle)
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

        run = ServiceRun.measure(host=handle.host.name, service=handle.name, algorithm=handle.algorithm,
                                 url=handle.url, settings=settings, native=handle.native, model=model,
                                 headers=headers, say=progress, flush_refused=refusal,
                                 runner=functools.partial(run_load, so_far=so_far))
        progress(run.headline())
        self.runs[key] = run
        item.use(run)
        item.measured.append(run)
        self._compare(handle.host, run)
        self._write_plots(run)
        self.publish(handle.host, run)
        return run

    def _compare(self, host: HostContext, run: ServiceRun) -> None:
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

    def publish(self, host: HostContext, run: ServiceRun) -> None:
        """Numbers into the verdict (host.facts.metrics), the per-service JSON under the report dir."""
        host.facts.metrics.update(run.metrics())
        host.facts.metrics.update(throughput_interval(run))
        if run.accept_length is not None:
            host.facts.accept_lengths[run.service] = round(run.accept_length, 4)
        run.write(self.report_dir(host.name) / f"{safe_name(run.service)}.json")

    def _write_plots(self, run: ServiceRun) -> None:
        directory = self.report_dir(run.host)
        directory.mkdir(parents=True, exist_ok=True)
        for name, svg in _plots(run).items():
            (directory / f"{safe_name(run.service)}.{name}.svg").write_text(svg, encoding="utf-8")


class PerfLayer:
    """The `dflash_perf` fixture: measure a service once per run, judge it, and fail with the evidence."""

    def __init__(self, book: PerfBook, item: PerfItem, node: pytest.Item | None = None) -> None:
        self.book = book
        self.item = item
        self.node = node

    @property
    def options(self) -> PerfOptions:
        return self.book.options

    def floors(self, handle: ServiceHandle) -> Mapping[str, float | str]:
        return handle.host.profile.floors.get(handle.name, {})

    def settings(self, handle: ServiceHandle) -> PerfSettings:
        return self.book.settings(handle)

    def measure(self, handle: ServiceHandle) -> ServiceRun:
        """The service's load run (measured by the first perf test that needs it, then shared)."""
        return self.book.measure(handle, self.item)

    def measure_peer(self, handle: ServiceHandle, name: str) -> ServiceRun:
        """Another service of the same host, made ready first (skipped as blocked when it is not usable)."""
        from pytest_dflash.run.fixtures import ready_or_blocked

        other = ready_or_blocked(handle.host.service(name), self.node, role="the speed-up's reference")
        return self.measure(other)

    def record(self, run: ServiceRun, judgements: Iterable[Judgement]) -> list[Judgement]:
        """Keep the judgements on the run (JSON, metrics, summary) and on this test (its report section)."""
        out = run.judge(judgements)
        self.item.use(run)
        self.item.judgements += [(run, j) for j in out]
        host = _host_of(run, self.book)
        if host is not None:
            self.book.publish(host, run)
        return out

    def check(self, run: ServiceRun, judgements: Iterable[Judgement]) -> None:
        """Fail the test unless every judgement passed; the first line names the first one that did not."""
        __tracebackhide__ = True
        judged = self.record(run, judgements)
        failing = [j for j in judged if j.outcome in NOT_PASSING]
        if not failing:
            return
        lines = [f"{run.label}: {failing[0].message}"]
        lines += [f"  {j.message}" for j in judged if j is not failing[0]]
        lines.append(f"  measured: {run.headline()}")
        inconclusive = [j for j in failing if j.outcome == "inconclusive"]
        if inconclusive:
            wanted = [(j.n or 0) + j.more_requests for j in inconclusive if j.more_requests]
            lines.append(INCONCLUSIVE_HINT.format(requests=max(wanted) if wanted else "N"))
        if any(j.outcome == "refused" for j in failing):
            lines.append(REFUSED_HINT)
        pytest.fail("\n".join(lines))

    # ---- the tests' bodies (kept here so that the suite stays one line per behaviour) ----

    def floors_of(self, handle: ServiceHandle) -> None:
        """Errors, output tok/s and latency ceilings of [floors.SERVICE]."""
        __tracebackhide__ = True
        floors = self.floors(handle)
        run = self.measure(handle)
        judgements = judge_floors(run, floors)
        self.check(run, judgements)
        if len(judgements) == 1:
            pytest.skip(f"no throughput/latency floor for {handle.label} in [floors.{handle.name}] of "
                        f"{handle.host.profile.source}: measured {run.headline()} (no errors)")

    def accept_length_of(self, handle: ServiceHandle) -> None:
        __tracebackhide__ = True
        if handle.algorithm == "NONE":  # an attached server says what it runs only in /server_info
            pytest.skip(f"{handle.label} does not use speculative decoding")
        run = self.measure(handle)
        self.check(run, [judge_accept_length(run, self.floors(handle))])

    def quick_accept_length_of(self, handle: ServiceHandle, prompts: Sequence[str], *, max_tokens: int = 64) -> None:
        """Smoke: accept length on a few greedy prompts >= [floors.SERVICE] accept_length (>= 1 without one).

        A point estimate (greedy accept length is deterministic for a given server); suites/perf bounds it.
        """
        __tracebackhide__ = True
        if not handle.native:
            pytest.skip("accept length needs SGLang's native /generate meta_info")
        if handle.algorithm == "NONE":  # an attached server says what it runs only in /server_info
            pytest.skip(f"{handle.label} does not use speculative decoding")
        raw = self.floors(handle).get("accept_length")
        floor = float(raw) if isinstance(raw, int | float) else None
        result = measure_acceptance(handle, prompts, max_tokens=max_tokens,
                                    allowed=self.options.allow_state_changes)
        check_floor(result, floor, where=f"[floors.{handle.name}] accept_length of {handle.host.profile.source}")

    def token_latency_of(self, handle: ServiceHandle, *, tokens: int = 32) -> Judgement:
        """Smoke: one streamed greedy request; its time per output token must stay under a sanity ceiling."""
        __tracebackhide__ = True
        if self.options.tpot_ceiling_off:
            pytest.skip("--tpot-ceiling-ms off")
        ceiling, source = token_latency_ceiling(self.floors(handle), self.options.tpot_ceiling_ms)
        api: Api = "generate" if handle.native else "completions"
        stream = request_stream(handle.client, api, PROMPT, Sampling(max_tokens=tokens, temperature=0.0,
                                                                     ignore_eos=True))
        latency = stream_token_latency(stream, tokens)
        judgement = judge_token_latency(latency, ceiling, source)
        tpot = None if latency.tpot_ms is None else round(latency.tpot_ms, 2)
        ttft = round(latency.ttft_ms, 2) if math.isfinite(latency.ttft_ms) else None
        handle.host.facts.metrics[f"token_latency:{handle.name}"] = {
            "ttft_ms": ttft, "tpot_ms": tpot, "tokens": tokens, "ceiling_ms": ceiling, "source": source,
            "outcome": judgement.outcome}
        if judgement.outcome != "pass":
            pytest.fail(f"{handle.label}: {judgement.message}", pytrace=False)
        return judgement

    def speedup_of(self, handle: ServiceHandle) -> None:
        __tracebackhide__ = True
        floors = self.floors(handle)
        versus, floor = floors.get("speedup_vs"), floors.get("speedup")
        if not isinstance(versus, str) or not isinstance(floor, int | float):
            pytest.skip(f"no speedup_vs / speedup floor for {handle.label} in [floors.{handle.name}]")
        run = self.measure(handle)
        other = self.measure_peer(handle, versus)
        self.check(run, [judge_speedup(run, other, float(floor), confidence=confidence_of(floors))])

    def baseline_of(self, handle: ServiceHandle) -> None:
        """Compare with the recorded baseline, or (--update-baseline) record this run if it is good."""
        __tracebackhide__ = True
        floors = self.floors(handle)
        run = self.measure(handle)
        path = baseline_path(self.options.baseline_dir, handle.host.name, handle.name)
        if self.options.update_baseline:
            self._record_baseline(handle, run, path, floors)
            return
        if not path.is_file():
            pytest.skip(f"no baseline for {handle.label} at {path}: record a good run with --update-baseline")
        try:
            baseline = load_baseline(path)
        except ValueError as exc:
            pytest.fail(f"{handle.label}: {exc}", pytrace=False)
        run.baseline = {"path": str(path), "recorded": baseline.recorded, "action": "compared"}
        self.check(run, judge_baseline(run, baseline, floors))

    def _record_baseline(self, handle: ServiceHandle, run: ServiceRun, path: Path,
                         floors: Mapping[str, float | str]) -> None:
        __tracebackhide__ = True
        if run.refusal:
            pytest.fail(f"{handle.label}: baseline NOT recorded: {run.refusal}\n{REFUSED_HINT}")
        judged = [run.judgements[k] for k in run.judgements if not k.startswith(("baseline", "speedup"))]
        if not judged:
            judged = run.judge(judge_floors(run, floors))
            if run.algorithm != "NONE" and run.native:
                judged += run.judge([judge_accept_length(run, floors)])
        bad = [j for j in judged if j.outcome in NOT_PASSING]
        if bad:
            pytest.fail(f"{handle.label}: baseline NOT recorded: this run did not pass its floors: {bad[0].message}"
                        + "".join(f"\n  {j.message}" for j in bad[1:]))
        previous = ""
        if path.is_file():
            try:
                old = load_baseline(path)
                previous = (f" (replaces the one recorded {old.recorded}: "
                            f"{old.result.metrics['output_throughput']:.1f} tok/s)")
            except ValueError:
                previous = " (replaces an unreadable file)"
        save_baseline(run, path)
        run.baseline = {"path": str(path), "action": "recorded"}
        self.record(run, [])
        handle.host.run.progress(f"{handle.label}: baseline recorded at {path}{previous}: {run.headline()}")


def throughput_interval(run: ServiceRun) -> dict[str, float]:
    """`perf.<service>.output_throughput.lower/.upper`: the bootstrap bounds (each one-sided at 95%) of this
    run's output tok/s, the spread the fleet trend judges a throughput change against (fleet/trend.py): the
    floor judgement's when there is one, else computed here. {} when the run has no successful request."""
    from pytest_dflash.layers.perf.stats import bootstrap_bound, metric_sample

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


def _host_of(run: ServiceRun, book: PerfBook) -> HostContext | None:
    from pytest_dflash.run.stash import RUN_KEY

    dflash_run = book.config.stash.get(RUN_KEY, None)
    if dflash_run is None or run.host not in dflash_run.profiles:
        return None
    return dflash_run.host(run.host)


@pytest.fixture
def dflash_perf(request: pytest.FixtureRequest) -> PerfLayer:
    """The perf layer: `dflash_perf.floors_of(dflash_service)`, `.measure(...)`, `.check(run, judgements)`."""
    item = request.node.stash.setdefault(ITEM_KEY, PerfItem())
    node = request.node if isinstance(request.node, pytest.Item) else None
    return PerfLayer(request.config.stash[BOOK_KEY], item, node)


# ---- reporting -------------------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    perf = item.stash.get(ITEM_KEY, None)
    if perf is None or report.when != "call" or not perf.runs:
        return report
    text = []
    for run in perf.runs:
        text.append(run.headline())
        if run.refusal:
            text.append(f"  REFUSED: {run.refusal}")
        text += [f"  {j.message}" for r, j in perf.judgements if r is run]
    report.sections.append(("dflash perf", "\n".join(text)))
    report.user_properties.append(("dflash_perf", [run.summary() for run in perf.runs]))
    if item.config.pluginmanager.hasplugin("html"):
        from pytest_html import extras

        blocks = [_html_block(run, plots=run in perf.measured) for run in perf.runs]
        report.extras = [*getattr(report, "extras", []), extras.html("".join(blocks))]  # type: ignore[attr-defined]
    return report


def _plots(run: ServiceRun) -> dict[str, str]:
    """Latency CDF, tokens/s over time and (speculative services) the accept-length histogram, as SVG."""
    from pytest_dflash.report.plots import plots_for_result

    svgs = plots_for_result(run.result)
    if run.accept_length is None:
        svgs.pop("accept_length", None)  # NONE, or no native API: nothing to draw
    return svgs


def _html_block(run: ServiceRun, *, plots: bool) -> str:
    colour = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#ef6c00", "refused": "#6a1b9a"}
    rows = "".join(
        f'<tr><td style="color:{colour[j.outcome]};font-weight:bold">{j.outcome}</td>'
        f"<td>{html.escape(j.message)}</td></tr>" for j in run.judgements.values())
    out = [f'<div class="dflash-perf" style="margin:6px 0"><b>{html.escape(run.headline())}</b>']
    if rows:
        out.append(f'<table class="dflash-perf-judgements">{rows}</table>')
    if plots:
        svgs = _plots(run)
        out.append('<div style="display:flex;flex-wrap:wrap;gap:8px">' + "".join(svgs.values()) + "</div>")
    out.append("</div>")
    return "".join(out)


class PerfSummary:
    """Controller side (also under xdist): the latest summary of each service's perf run, for the terminal."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, str], dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == "dflash_perf" and isinstance(value, list):
                for summary in value:
                    if isinstance(summary, dict):
                        self.latest[(str(summary["host"]), str(summary["service"]))] = summary

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if not self.latest:
            return
        terminalreporter.section("dflash perf")
        for line in summary_lines(self.latest.values()):
            terminalreporter.write_line(line)


def summary_lines(summaries: Iterable[Mapping[str, Any]]) -> list[str]:
    """Per host: each service's numbers, then its judgements, then the speed-ups at the same load."""
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for summary in summaries:
        by_host.setdefault(str(summary["host"]), []).append(summary)
    lines: list[str] = []
    for host, services in sorted(by_host.items()):
        loads = sorted({str(s["describe"]) for s in services})
        lines.append(f"{host}: {'; '.join(loads)}")
        for s in services:
            bounds = ""
            if isinstance(s.get("lower"), int | float) and math.isfinite(s["lower"]):
                bounds = f" [{s['lower']:.1f}, {s['upper']:.1f}]"
            parts = [f"{s['output_tok_s']:.1f} tok/s{bounds}"]
            if s.get("p99_ttft_ms") is not None:
                parts.append(f"TTFT p50/p99 {s['median_ttft_ms']:.1f}/{s['p99_ttft_ms']:.1f} ms")
            if s.get("p99_itl_ms") is not None:
                parts.append(f"ITL p99 {s['p99_itl_ms']:.1f} ms")
            if s.get("accept_length") is not None:
                server = s.get("server_accept_length")
                parts.append(f"accept length {s['accept_length']:.2f}"
                             + (f" (server {server:.2f})" if server is not None else ""))
            by_category = s.get("accept_length_by_category") or {}
            if by_category:
                parts.append("per category " + ", ".join(f"{k} {v:.2f}" for k, v in by_category.items()))
            if s.get("failed"):
                parts.append(f"{s['failed']} failed requests")
            if s.get("saturated"):
                parts.append("CLIENT SATURATED")
            lines.append(f"    {s['service']} ({s['algorithm']}): {', '.join(parts)}")
            outcomes = s.get("outcomes") or {}
            judged = ", ".join(f"{k} {'PASS' if v == 'pass' else v.upper()}" for k, v in outcomes.items())
            if judged:
                lines.append(f"        {judged}")
        speedups = [c for s in services for c in s.get("comparisons") or []]
        if speedups:
            lines.append("    speed-up (output tok/s, same load, 95% bounds): " + "; ".join(speedups))
    return lines
