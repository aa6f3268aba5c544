"""One service's perf run: the load run (measured again while the client was saturated), everything judged on
it, and its record (headline, verdict metrics, terminal summary, the per-service JSON).

    run = ServiceRun.measure(host="ct200", service="dflash", algorithm="DFLASH", url=..., settings=settings,
                             native=True)
    run.judge(judge_floors(run, floors))
    run.write(perf_file(report_dir, run.host, run.service))  # book.py: <report dir>/perf/<host>/<svc>.json

Nothing here imports pytest.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_dflash.files import atomic_write
from pytest_dflash.layers.perf.judgement import Comparison, Judgement
from pytest_dflash.layers.perf.settings import PerfSettings
from pytest_dflash.load.results import LoadResult
from pytest_dflash.load.run import run_load
from pytest_dflash.load.workload import Workload

__all__ = ["Runner", "ServiceRun", "write_json"]

Runner = Callable[..., LoadResult]


@dataclass
class ServiceRun:
    """One service's load run and everything judged on it."""

    host: str
    service: str
    algorithm: str
    settings: PerfSettings
    result: LoadResult
    native: bool = True
    attempts: int = 1
    saturated_attempts: int = 0
    judgements: dict[str, Judgement] = field(default_factory=dict)
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None
    wall_s: float = 0.0
    # why the server-side accept length was not read (no flush allowed)
    server_accept_skipped: str | None = None

    @classmethod
    def measure(cls, *, host: str, service: str, algorithm: str, url: str, settings: PerfSettings,
                native: bool, model: str = "default", headers: Mapping[str, str] | None = None,
                progress: bool | None = None, runner: Runner = run_load,
                say: Callable[[str], None] = lambda message: None,
                flush_refused: str | None = None) -> ServiceRun:
        """Load the service; a run in which the client was saturated is measured again (``retries``).

        `flush_refused`: why /flush_cache may not be sent; the run then reads no server-side accept length (it
        would be cumulative since the server started, other traffic included) and says so.
        """
        speculative = algorithm != "NONE"
        spec = settings.load_spec(native=native, speculative=speculative, model=model,
                                  may_flush=flush_refused is None)
        skipped = ("not read: it is only meaningful after a /flush_cache, which was not sent: "
                   f"{flush_refused}"
                   if flush_refused is not None and native and speculative else None)
        started = time.monotonic()
        saturated = 0
        attempt = 0
        result: LoadResult | None = None
        for attempt in range(1, settings.retries + 2):
            result = runner(url, spec, headers=headers, progress=progress, keep_token_times=True)
            if not result.client_saturated:
                break
            saturated += 1
            say(f"{host}/{service}: the load client was saturated ({'; '.join(result.saturation.reasons)})"
                + (": measuring again" if attempt <= settings.retries else ""))
        assert result is not None
        return cls(host=host, service=service, algorithm=algorithm, settings=settings, result=result,
                   native=native, attempts=attempt, saturated_attempts=saturated,
                   wall_s=time.monotonic() - started, server_accept_skipped=skipped)

    @property
    def label(self) -> str:
        return f"{self.host}/{self.service}"

    @property
    def refusal(self) -> str | None:
        """Why no floor may be judged on this run (the client was the bottleneck), or None."""
        if not self.result.client_saturated:
            return None
        sat = self.result.saturation
        reasons = "; ".join(sat.reasons) or "saturated"
        spread = ""
        # one saturated process of N refuses the whole run: its share measured the client
        if sat.processes > 1:
            which = ", ".join(str(k) for k in sat.saturated_processes) or "?"
            spread = (f"; the run was spread over {sat.processes} client processes and process(es) {which} "
                      "saturated, which refuses the whole run")
        return (f"the load client was saturated ({reasons}) in {self.saturated_attempts} of {self.attempts} "
                f"run(s): its numbers measure the client, not {self.label}{spread}")

    @property
    def accept_length(self) -> float | None:
        """Accept length from the requests' meta_info (Σ output tokens / Σ verify steps), else the
        server's."""
        spec = [r for r in self.result.successful if r.verify_ct]
        if spec:
            return sum(float(r.output_tokens or 0) for r in spec) / sum(float(r.verify_ct or 0) for r in spec)
        return self.result.server_accept_length

    @property
    def accept_length_by_category(self) -> dict[str, float]:
        """Accept length per dataset category (Σ output tokens / Σ verify steps of its requests); {} for
        synthetic prompts or a dataset without categories. Request i's category comes from the spec (the same
        seeded order)."""
        spec = self.result.spec
        if not spec.dataset:
            return {}
        try:
            workload = Workload(spec)
        except ValueError:
            return {}
        sums: dict[str, list[float]] = {}
        for r in self.result.successful:
            if not r.verify_ct:
                continue
            category = workload.item(r.index).category
            if category is None:
                continue
            entry = sums.setdefault(category, [0.0, 0.0])
            entry[0] += float(r.output_tokens or 0)
            entry[1] += float(r.verify_ct)
        return {name: round(tokens / steps, 4) for name, (tokens, steps) in sorted(sums.items()) if steps}

    def judge(self, judgements: Iterable[Judgement]) -> list[Judgement]:
        """Record judgements (the latest per key wins) and return them."""
        out = list(judgements)
        for judgement in out:
            self.judgements[judgement.key] = judgement
        return out

    def headline(self) -> str:
        m = self.result.metrics
        parts = [f"{m['output_throughput']:.1f} output tok/s",
                 f"{m['completed']} requests in {m['duration']:.1f} s"]
        if m.get("p99_ttft_ms") is not None:
            parts.append(f"TTFT p50/p99 {m['median_ttft_ms']:.1f}/{m['p99_ttft_ms']:.1f} ms")
        if m.get("p99_itl_ms") is not None:
            parts.append(f"ITL p99 {m['p99_itl_ms']:.1f} ms")
        if self.accept_length is not None:
            server = self.result.server_accept_length
            parts.append(f"accept length {self.accept_length:.3f} (client"
                         + (f"; server-reported {server:.3f})" if server is not None else ")"))
        by_category = self.accept_length_by_category
        if by_category:
            parts.append("per category " + ", ".join(f"{k} {v:.2f}" for k, v in by_category.items()))
        return f"{self.label} ({self.algorithm}): " + ", ".join(parts)

    def metrics(self) -> dict[str, float]:
        """Numbers for the verdict's ``metrics`` (and the fleet summary / Prometheus):
        perf.<service>.<name>."""
        prefix = f"perf.{self.service}."
        m = self.result.metrics
        out: dict[str, float] = {}
        for name in ("output_throughput", "request_throughput", "completed", "failed", "duration",
                     "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "mean_tpot_ms",
                     "median_e2e_latency_ms", "p99_e2e_latency_ms"):
            value = m.get(name)
            if isinstance(value, int | float) and math.isfinite(value):
                out[prefix + name] = round(float(value), 4)
        # the accept length the headline states and the check judges (the client's, Σ tokens / Σ verify
        # steps of the requests, else the server's); the server's own beside it, named as such
        if self.accept_length is not None and math.isfinite(self.accept_length):
            out[prefix + "accept_length"] = round(self.accept_length, 4)
        if self.result.server_accept_length is not None:
            out[prefix + "server_accept_length"] = round(self.result.server_accept_length, 4)
        for category, value in self.accept_length_by_category.items():
            out[f"{prefix}accept_length_by_category.{category}"] = value
        out[prefix + "concurrency"] = float(self.settings.concurrency)
        out[prefix + "client_saturated"] = 1.0 if self.result.client_saturated else 0.0
        for key, judgement in self.judgements.items():
            out[f"{prefix}{key}.pass"] = 1.0 if judgement.passed else 0.0
            if judgement.outcome == "inconclusive":
                out[f"{prefix}{key}.inconclusive"] = 1.0
            if judgement.bound is not None and math.isfinite(judgement.bound):
                out[f"{prefix}{key}.bound"] = round(judgement.bound, 4)
        for versus, comparison in self.comparisons.items():
            out[f"{prefix}speedup_vs_{versus}"] = round(comparison.point, 4)
            out[f"{prefix}speedup_vs_{versus}.lower"] = round(comparison.lower, 4)
            out[f"{prefix}speedup_vs_{versus}.upper"] = round(comparison.upper, 4)
        return out

    def junit_properties(self) -> list[tuple[str, float]]:
        """The measurements as flat JUnit properties a CI tool can chart (`dflash.perf.dflash.output_tok_s`):
        output tok/s, TTFT and ITL p50 / p99, mean TPOT, accept length, each speed-up; no thresholds."""
        m = self.result.metrics
        names = (("output_tok_s", "output_throughput"), ("ttft_p50_ms", "median_ttft_ms"),
                 ("ttft_p99_ms", "p99_ttft_ms"), ("itl_p50_ms", "median_itl_ms"),
                 ("itl_p99_ms", "p99_itl_ms"),
                 ("tpot_mean_ms", "mean_tpot_ms"))
        values: list[tuple[str, object]] = [(name, m.get(key)) for name, key in names]
        values.append(("accept_length", self.accept_length))
        values += [(f"speedup_vs_{versus}", c.point) for versus, c in self.comparisons.items()]
        prefix = f"dflash.perf.{self.service}."
        return [(prefix + name, round(float(value), 4)) for name, value in values
                if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)]

    def summary(self) -> dict[str, Any]:
        """A small JSON-able record for the terminal summary (sent from xdist workers in the report)."""
        m = self.result.metrics
        throughput = self.judgements.get("output_tok_s")
        lower = throughput.lower if throughput is not None else None
        upper = throughput.upper if throughput is not None else None
        return {
            "host": self.host, "service": self.service, "algorithm": self.algorithm,
            "describe": self.settings.describe(self.native), "output_tok_s": m["output_throughput"],
            "lower": lower, "upper": upper, "completed": m["completed"], "failed": m["failed"],
            "median_ttft_ms": m.get("median_ttft_ms"), "p99_ttft_ms": m.get("p99_ttft_ms"),
            "p99_itl_ms": m.get("p99_itl_ms"), "accept_length": self.accept_length,
            "request_throughput": m.get("request_throughput"),
            "median_e2e_latency_ms": m.get("median_e2e_latency_ms"),
            "p99_e2e_latency_ms": m.get("p99_e2e_latency_ms"),
            "accept_length_by_category": self.accept_length_by_category,
            "server_accept_length": self.result.server_accept_length,
            "saturated": self.result.client_saturated,
            "outcomes": {k: j.outcome for k, j in self.judgements.items()},
            "comparisons": [c.describe() for c in self.comparisons.values()],
        }

    def document(self) -> dict[str, Any]:
        """The per-service JSON: bench_serving's field names at the top level, then ``dflash_perf``."""
        doc: dict[str, Any] = json.loads(self.result.to_json())
        doc["dflash_perf"] = {
            "host": self.host, "service": self.service, "algorithm": self.algorithm,
            "settings": asdict(self.settings), "attempts": self.attempts,
            "saturated_attempts": self.saturated_attempts, "refused": self.refusal,
            "server_accept_length_skipped": self.server_accept_skipped,
            "judgements": [j.as_dict() for j in self.judgements.values()],
            "comparisons": [asdict(c) for c in self.comparisons.values()],
            "baseline": self.baseline,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        return doc

    def write(self, path: Path) -> Path:
        write_json(path, self.document())
        return path


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Atomically (a reader never sees half a file)."""
    atomic_write(path, json.dumps(doc, indent=1, allow_nan=False) + "\n", sync=False)
