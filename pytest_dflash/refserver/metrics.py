"""``/metrics`` in Prometheus text format, with the ``sglang:*`` names and labels of SGLang 0.5.17."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["Metrics"]

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
                200.0, 400.0)
E2E_BUCKETS = (*TTFT_BUCKETS, 600.0, 1200.0, 1800.0, 2400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
               0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        i = bisect.bisect_left(self.buckets, value)
        for j in range(i, len(self.buckets)):
            self.counts[j] += 1
        self.total += value
        self.n += 1


class Metrics:
    """Counters the HTTP side and the scheduler update; rendered on demand."""

    def __init__(self, model_name: str) -> None:
        self.model = model_name
        self.requests = {"false": 0, "true": 0}
        self.prompt_tokens = {"false": 0, "true": 0}
        self.generation_tokens = {"false": 0, "true": 0}
        self.ttft = {"false": Histogram(TTFT_BUCKETS), "true": Histogram(TTFT_BUCKETS)}
        self.e2e = {"false": Histogram(E2E_BUCKETS), "true": Histogram(E2E_BUCKETS)}
        self.itl = Histogram(ITL_BUCKETS)
        self.http_requests: dict[tuple[str, str], int] = {}
        self.http_responses: dict[tuple[str, str, int], int] = {}

    def finished(self, *, streaming: bool, prompt: int, generated: int, ttft: float, e2e: float) -> None:
        key = "true" if streaming else "false"
        self.requests[key] += 1
        self.prompt_tokens[key] += prompt
        self.generation_tokens[key] += generated
        self.ttft[key].observe(ttft)
        self.e2e[key].observe(e2e)
        if generated > 1:
            self.itl.observe((e2e - ttft) / (generated - 1))

    def render(self, *, spec: bool, verify_calls: int, gauges: dict[str, float]) -> str:
        base = f'engine_type="unified",model_name="{self.model}"'
        rank = f'{base},moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        streaming = {key: _sorted(f'{base},is_streaming="{key}"') for key in ("false", "true")}
        out: list[str] = []

        def head(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP sglang:{name} {help_text}")
            out.append(f"# TYPE sglang:{name} {kind}")

        def hist(name: str, h: Histogram, labels: str) -> None:
            out.append(f"sglang:{name}_sum{{{labels}}} {float(h.total)}")
            counts = h.counts or [0] * len(h.buckets)
            for le, c in zip(h.buckets, counts, strict=True):
                out.append(f'sglang:{name}_bucket{{{_le(labels, le)}}} {float(c)}')
            out.append(f'sglang:{name}_bucket{{{_le(labels, "+Inf")}}} {float(h.n)}')
            out.append(f"sglang:{name}_count{{{labels}}} {float(h.n)}")

        head("time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.")
        for key, h in self.ttft.items():
            hist("time_to_first_token_seconds", h, streaming[key])
        head("e2e_request_latency_seconds", "histogram", "Histogram of End-to-end request latency in seconds")
        for key, h in self.e2e.items():
            hist("e2e_request_latency_seconds", h, streaming[key])
        head("inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.")
        hist("inter_token_latency_seconds", self.itl, base)
        head("http_requests_total", "counter", "Total number of HTTP requests by endpoint and method")
        for (endpoint, method), n in self.http_requests.items():
            out.append(f'sglang:http_requests_total{{endpoint="{endpoint}",method="{method}"}} {float(n)}')
        head("http_responses_total", "counter", "Total number of HTTP responses by endpoint and status code")
        for (endpoint, method, status), n in self.http_responses.items():
            labels = f'endpoint="{endpoint}",method="{method}",status_code="{status}"'
            out.append(f"sglang:http_responses_total{{{labels}}} {float(n)}")
        for name, values, help_text in (
            ("prompt_tokens_total", self.prompt_tokens, "Number of prefill tokens processed."),
            ("generation_tokens_total", self.generation_tokens, "Number of generation tokens processed."),
        ):
            head(name, "counter", help_text)
            for key, n in values.items():
                out.append(f"sglang:{name}{{{streaming[key]}}} {float(n)}")
        if spec:
            head("spec_verify_calls_total", "counter", "Number of speculative decoding verification calls.")
            out.append(f"sglang:spec_verify_calls_total{{{base}}} {float(verify_calls)}")
        head("num_requests_total", "counter", "Number of requests processed.")
        for key, n in self.requests.items():
            out.append(f"sglang:num_requests_total{{{streaming[key]}}} {float(n)}")
        for name, help_text in (
            ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
            ("page_size", "KV cache page size in tokens."),
            ("context_len", "Maximum context length."),
            ("num_running_reqs", "The number of running requests."),
            ("num_queue_reqs", "The number of requests in the waiting queue."),
            ("gen_throughput", "The generation throughput (token/s)."),
            ("cache_hit_rate", "The prefix cache hit rate."),
            ("token_usage", "The token usage."),
        ):
            head(name, "gauge", help_text)
            out.append(f"sglang:{name}{{{rank}}} {float(gauges.get(name, 0.0))}")
        return "\n".join(out) + "\n"


def _le(labels: str, le: float | str) -> str:
    return _sorted(f'{labels},le="{le}"')


def _sorted(labels: str) -> str:
    """Labels in name order, as prometheus_client prints them."""
    return ",".join(sorted(labels.split(","), key=lambda p: p.split("=")[0]))
