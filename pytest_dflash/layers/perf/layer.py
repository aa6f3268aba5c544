"""The perf layer's public API: `PerfLayer`, the `dflash_perf` fixture's object, which measures a service once
per run, judges it, and fails the test with the evidence. Its `*_of` methods are the perf and smoke suites'
test bodies (kept here so that a suite stays one line per behaviour).

    def test_meets_its_floors(dflash_perf: PerfLayer, dflash_service: ServiceHandle) -> None:
        dflash_perf.floors_of(dflash_service)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from pytest_dflash.client.sampling import Sampling
from pytest_dflash.layers.generation.requests import PROMPT, Api, request_stream
from pytest_dflash.layers.parity.acceptance import check_accepts_drafts
from pytest_dflash.layers.parity.checks import draft_block, measure_acceptance, required_floor
from pytest_dflash.layers.perf.baseline import (
    baseline_path,
    judge_baseline,
    load_baseline,
    recorded_baseline,
    save_baseline,
)
from pytest_dflash.layers.perf.book import PerfBook, PerfItem, host_of
from pytest_dflash.layers.perf.judgement import NOT_PASSING, Judgement
from pytest_dflash.layers.perf.judging import confidence_of, judge_accept_length, judge_floors, judge_speedup
from pytest_dflash.layers.perf.options import PerfOptions
from pytest_dflash.layers.perf.service_run import ServiceRun
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.layers.perf.sweep.checks import check_sweep
from pytest_dflash.layers.perf.token_latency import (
    judge_token_latency,
    stream_token_latency,
    token_latency_ceiling,
)
from pytest_dflash.run import skips
from pytest_dflash.run.handle import ServiceHandle

__all__ = ["INCONCLUSIVE_HINT", "REFUSED_HINT", "PerfLayer"]

INCONCLUSIVE_HINT = ("INCONCLUSIVE is not a pass: the test fails and a --gate with perf does not pass. "
                     "Measure longer: --perf-requests {requests} (or [perf] requests in the profile).")
REFUSED_HINT = ("REFUSED: the load client was the bottleneck, so nothing was judged. Run the client on a "
                "quieter machine, lower [perf] concurrency, or raise [perf] max_loop_lag_ms / "
                "max_client_cpu.")


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
        host = host_of(run, self.book)
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
            skips.not_applicable(f"no throughput/latency floor for {handle.label} in [floors.{handle.name}] "
                                 f"of {handle.host.profile.source}: measured {run.headline()} (no errors)")

    def accept_length_of(self, handle: ServiceHandle) -> None:
        __tracebackhide__ = True
        if handle.algorithm == "NONE":  # an attached server says what it runs only in /server_info
            skips.not_applicable(f"{handle.label} does not use speculative decoding")
        run = self.measure(handle)
        self.check(run, [self._judge_accept_length(handle, run)])

    def _judge_accept_length(self, handle: ServiceHandle, run: ServiceRun) -> Judgement:
        """Against the service's floor, its `unaccepted_draft` exemption or the default minimum (one rule with
        the smoke and parity layers: `acceptance.required_floor`)."""
        return judge_accept_length(run, self.floors(handle), unaccepted_draft=handle.spec.unaccepted_draft,
                                   source=str(handle.host.profile.source), block=draft_block(handle))

    def quick_accept_length_of(self, handle: ServiceHandle, prompts: Sequence[str], *,
                               max_tokens: int = 64) -> None:
        """Smoke: accept length on a few greedy prompts reaches the service's floor
        (`parity.checks.required_floor`: [floors.SERVICE] accept_length, 1 for a declared unaccepted_draft,
        else the default minimum).

        A point estimate (greedy accept length is deterministic for a given server); suites/perf bounds it.
        """
        __tracebackhide__ = True
        if handle.algorithm == "NONE":  # an attached server says what it runs only in /server_info
            skips.not_applicable(f"{handle.label} does not use speculative decoding")
        skips.needs_sglang(handle, "accept length needs SGLang's native /generate meta_info")
        result = measure_acceptance(handle, prompts, max_tokens=max_tokens,
                                    allowed=self.options.allow_state_changes)
        check_accepts_drafts(result, required_floor(handle), block=draft_block(handle))

    def token_latency_of(self, handle: ServiceHandle, *, tokens: int = 32) -> Judgement:
        """Smoke: one streamed greedy request; its time per output token must stay under a sanity ceiling."""
        __tracebackhide__ = True
        if self.options.tpot_ceiling_off:
            skips.not_applicable("--tpot-ceiling-ms off")
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
            skips.not_applicable(f"no speedup_vs / speedup floor for {handle.label} in "
                                 f"[floors.{handle.name}]")
        run = self.measure(handle)
        other = self.measure_peer(handle, versus)
        self.check(run, [judge_speedup(run, other, float(floor), confidence=confidence_of(floors))])

    # ---- load sweeps (layers/perf/sweep/): the host's sweep, run once, judged by the service's gates ----

    def sweep_within_slo_of(self, handle: ServiceHandle) -> None:
        """max_concurrency_within_slo: every level up to N meets the service's [slo]."""
        __tracebackhide__ = True
        self._sweep_gates(handle, "slo")

    def goodput_of(self, handle: ServiceHandle) -> None:
        """goodput_at = {LEVEL = req/s}: requests/s within the SLOs at a level, on its lower bound."""
        __tracebackhide__ = True
        self._sweep_gates(handle, "goodput")

    def crossover_of(self, handle: ServiceHandle) -> None:
        """crossover_vs + speedup_up_to (+ min_speedup): not slower than the plain twin up to a level."""
        __tracebackhide__ = True
        self._sweep_gates(handle, "crossover")

    def _sweep_gates(self, handle: ServiceHandle, kind: str) -> None:
        __tracebackhide__ = True
        check_sweep(self.book.sweeps, handle, kind, node=self.node, properties=self.item.properties,
                    lines=self.item.sweep_lines)

    def baseline_of(self, handle: ServiceHandle) -> None:
        """Compare with the recorded baseline, or (--update-baseline) record this run if it is good."""
        __tracebackhide__ = True
        floors = self.floors(handle)
        run = self.measure(handle)
        path = baseline_path(self.options.baseline_dir, handle.host.name, handle.name)
        if self.options.update_baseline:
            self._record_baseline(handle, run, path, floors)
            return
        found = recorded_baseline(self.options.baseline_dir, handle.host.name, handle.name)
        if found is None:
            skips.not_applicable(f"no baseline for {handle.label} at {path}: record a good run with "
                                 "--update-baseline")
        try:
            baseline = load_baseline(found)
        except ValueError as exc:
            pytest.fail(f"{handle.label}: {exc}", pytrace=False)
        if found != path:
            handle.host.notes.append(f"{handle.label}: perf baseline read from {found}, where it was "
                                     "recorded before file names were injective; --update-baseline records "
                                     f"it at {path}")
        run.baseline = {"path": str(found), "recorded": baseline.recorded, "action": "compared"}
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
                judged += run.judge([self._judge_accept_length(handle, run)])
        bad = [j for j in judged if j.outcome in NOT_PASSING]
        if bad:
            pytest.fail(f"{handle.label}: baseline NOT recorded: this run did not pass its floors: "
                        f"{bad[0].message}"
                        + "".join(f"\n  {j.message}" for j in bad[1:]))
        previous = ""
        earlier = recorded_baseline(self.options.baseline_dir, handle.host.name, handle.name)
        if earlier is not None:
            try:
                old = load_baseline(earlier)
                previous = (f" (replaces the one recorded {old.recorded}: "
                            f"{old.result.metrics['output_throughput']:.1f} tok/s)")
            except ValueError:
                previous = " (replaces an unreadable file)"
        save_baseline(run, path)
        run.baseline = {"path": str(path), "action": "recorded"}
        self.record(run, [])
        handle.host.run.progress(f"{handle.label}: baseline recorded at {path}{previous}: {run.headline()}")
