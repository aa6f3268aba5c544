"""What judging a perf run produces: a `Judgement` (one floor, baseline or speed-up, with its outcome and
evidence) and a `Comparison` (the speed-up of one service over another at the same load).

An outcome is one of four:

* ``pass`` — the bound on the good side clears the threshold;
* ``fail`` — the bound on the bad side is past it (the message has the measured value, the bound, the
  confidence level and the threshold);
* ``inconclusive`` — the run was too short or too noisy to decide; the message says about how many more
  requests would decide. Never a silent pass: the perf suite fails the test (see docs/perf.md, *Outcomes*);
* ``refused`` — the load client itself was saturated (event-loop lag, CPU): its numbers measure the client,
  not the server, so no timing floor is judged on them (the run is measured again ``retries`` times first).
  Accept length is the exception: the server counts it per request (tokens / verify steps), so a slow client
  does not change it and it is judged either way.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pytest_dflash.layers.perf.verdicts import Verdict

__all__ = ["NOT_PASSING", "Comparison", "Judgement", "Outcome"]

Outcome = Literal["pass", "fail", "inconclusive", "refused"]
NOT_PASSING: tuple[Outcome, ...] = ("fail", "inconclusive", "refused")


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """One floor (or baseline, or speed-up) judged, with its evidence in ``message``."""

    # machine name: output_tok_s, itl_p99_ms, accept_length, speedup_vs_none, baseline.output_tok_s, errors
    key: str
    outcome: Outcome
    message: str
    point: float | None = None
    bound: float | None = None
    lower: float | None = None
    upper: float | None = None
    threshold: float | None = None
    confidence: float | None = None
    n: int | None = None
    more_requests: int | None = None

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @classmethod
    def of(cls, key: str, verdict: Verdict, *, message: str | None = None) -> Judgement:
        return cls(key=key, outcome=verdict.outcome, message=message or verdict.message, point=verdict.point,
                   bound=verdict.bound, lower=verdict.lower, upper=verdict.upper, threshold=verdict.threshold,
                   confidence=verdict.confidence, n=verdict.n, more_requests=verdict.more_requests)

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items()}


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Output tok/s of ``service`` over ``versus`` at the same load, with bounds at ``confidence`` each."""

    service: str
    versus: str
    algorithm: str
    versus_algorithm: str
    point: float
    lower: float
    upper: float
    confidence: float
    concurrency: int | None
    accept_length: float | None
    versus_accept_length: float | None

    def describe(self) -> str:
        """'ddtree/dflash 0.99x [0.93, 1.06] (accept length 5.00 vs 4.92)'."""
        accept = ""
        if self.accept_length is not None and self.versus_accept_length is not None:
            accept = f" (accept length {self.accept_length:.2f} vs {self.versus_accept_length:.2f})"
        elif self.accept_length is not None:
            accept = f" (accept length {self.accept_length:.2f})"
        return f"{self.service}/{self.versus} {self.point:.2f}x [{self.lower:.2f}, {self.upper:.2f}]{accept}"
