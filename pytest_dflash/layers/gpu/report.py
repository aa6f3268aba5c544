"""Failure messages for the GPU layers: the diagnosis first, then what was checked, then the evidence."""

from __future__ import annotations

from collections.abc import Mapping

from pytest_dflash.evidence.diagnosis import default_catalog, diagnose
from pytest_dflash.scrub.redact import redact

EVIDENCE_LIMIT = 12_000  # characters of evidence in one assertion message


def diagnosis_lines(evidence: str, *, diagnosis: str | None = None,
                    values: Mapping[str, str] | None = None) -> list[str]:
    """'[id] title' + remedy for an explicit catalog id, else for the best match in `evidence`."""
    if diagnosis is not None:
        sig = default_catalog().by_id(diagnosis)
        remedy = sig.remedy
        for key, value in (values or {}).items():
            remedy = remedy.replace("{" + key + "}", value)
        return [f"[{sig.id}] {sig.title}", f"    remedy: {remedy}"]
    found = diagnose(evidence, values=values)
    if not found:
        return []
    return [found[0].one_line(), f"    remedy: {found[0].remedy}", f"    evidence: {found[0].evidence}"]


def explain(summary: str, evidence: str = "", *, diagnosis: str | None = None,
            values: Mapping[str, str] | None = None) -> str:
    """An assertion message: diagnosis (named), summary, then the evidence (redacted, bounded)."""
    lines = diagnosis_lines(evidence, diagnosis=diagnosis, values=values)
    lines.append(summary)
    if evidence.strip():
        text = evidence.strip()
        if len(text) > EVIDENCE_LIMIT:
            text = "...\n" + text[-EVIDENCE_LIMIT:]
        lines += ["--- evidence ---", text]
    return redact("\n".join(lines))
