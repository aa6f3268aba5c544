"""What a diagnosis is, and how the catalog's matches of one failure become one diagnosis per root cause.

Several signatures often describe one event: a rank SIGKILLed is also 'a subprocess killed', 'the scheduler
crashed' and 'a connection dropped'. `fold` keeps the most specific one and records the others in it
(`folded`), in this order of rules:

1. a signature's own `folds` (the same event, said less specifically) are folded into it;
2. a consequence (`consequence = true`: what a failure looks like downstream) is folded into the first cause
   found beside it; with no cause, into the most specific consequence;

so what is left is ordered cause before consequence, most specific first (the catalog's priority), never
alphabetically. `headline` is a failure's first line: the diagnosis and its remedy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

# How a service is run, which decides what a remedy may ask (catalog `remedy_<mode>`): attached by URL with no
# host access, a container the run starts, a process or unit the run starts from its profile's command. A unit
# attached on a host the run can read takes the default remedy.
MODES = ("attach", "container", "provisioned")


@dataclass(frozen=True)
class Diagnosis:
    """One root cause: what it means, what to do, the line that proved it, and what it names."""

    id: str
    title: str
    remedy: str
    evidence: str
    layer: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    missing: str = ""  # a diagnosis from symptoms: the evidence that would confirm it, and how to add it
    folded: tuple[str, ...] = ()  # the ids of the signatures that matched the same event, less specifically
    subject: str = ""  # what failed, where known: 'tensor-parallel rank TP1 (rank 1, pid 4242, GPU 5) died …'

    def one_line(self) -> str:
        """'[id] subject: title' (the subject only where known)."""
        return f"[{self.id}] {self.subject}: {self.title}" if self.subject else f"[{self.id}] {self.title}"

    def headline(self) -> str:
        """A failure's first line: '[id] title — remedy: what to do'."""
        return self.one_line() + (f" — remedy: {self.remedy}" if self.remedy else "")

    def as_dict(self) -> dict[str, str]:
        out = {"id": self.id, "title": self.title, "remedy": self.remedy, "evidence": self.evidence,
               "layer": self.layer}
        if self.missing:
            out["missing"] = self.missing
        if self.folded:
            out["folded"] = ", ".join(self.folded)
        if self.subject:
            out["subject"] = self.subject
        return out


# (signature id, the ids it folds, whether it is a consequence, its diagnosis), most specific first
Match = tuple[str, Sequence[str], bool, Diagnosis]


def fold(matches: Sequence[Match]) -> list[Diagnosis]:
    """One diagnosis per root cause (see the module docstring), in the order of `matches`."""
    into: dict[str, str] = {}  # folded id -> the id it was folded into
    present = {ident for ident, _, _, _ in matches}
    for ident, folds, _, _ in matches:
        if ident in into:
            continue
        for other in folds:
            if other in present and other != ident and other not in into:
                into[other] = ident
    standing = [(ident, consequence) for ident, _, consequence, _ in matches if ident not in into]
    cause = next((ident for ident, consequence in standing if not consequence), None)
    target = cause or next((ident for ident, _ in standing), None)
    for ident, consequence in standing:
        if consequence and ident != target and target is not None:
            into[ident] = target
    out = []
    for ident, _, _, diagnosis in matches:
        if ident in into:
            continue
        folded = tuple(other for other, _, _, _ in matches if _root(other, into) == ident and other != ident)
        out.append(replace(diagnosis, folded=folded) if folded else diagnosis)
    return out


def _root(ident: str, into: Mapping[str, str]) -> str:
    seen = 0
    while ident in into and seen < 64:
        ident, seen = into[ident], seen + 1
    return ident


def with_subject(diagnoses: Sequence[Diagnosis], subject: str) -> list[Diagnosis]:
    """The first diagnosis names what failed (a rank, its pid and GPU): the root cause is that thing's."""
    if not diagnoses or not subject:
        return list(diagnoses)
    return [replace(diagnoses[0], subject=subject), *diagnoses[1:]]


def diagnosis_text(diagnoses: Sequence[Diagnosis]) -> str:
    """The `dflash diagnosis` report section: each root cause with its remedy, evidence, what is missing and
    the signatures folded into it."""
    lines = []
    for diagnosis in diagnoses:
        lines.append(diagnosis.one_line())
        if diagnosis.remedy:
            lines.append(f"    remedy: {diagnosis.remedy}")
        if diagnosis.evidence:
            lines.append(f"    evidence: {diagnosis.evidence}")
        if diagnosis.missing:
            lines.append(f"    missing: {diagnosis.missing}")
        if diagnosis.folded:
            lines.append(f"    the same event also matched: {', '.join(diagnosis.folded)}")
    return "\n".join(lines)
