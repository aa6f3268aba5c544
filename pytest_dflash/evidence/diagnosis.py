"""Diagnosis: match failure text (logs, journals, error messages) against a catalog of signatures.

The catalog is data (`catalog.toml`), not code: adding a failure mode is adding a table. A signature may also
name `symptoms`: what the plugin itself saw over HTTP (in the failure text) that points at it when no log was
read (a server attached by URL); such a diagnosis says which evidence is missing and how to add it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

CATALOG_PATH = Path(__file__).with_name("catalog.toml")


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    remedy: str
    any: tuple[re.Pattern[str], ...]
    all: tuple[re.Pattern[str], ...] = ()
    unless: tuple[re.Pattern[str], ...] = ()
    priority: int = 50
    layer: str = ""
    seen: str = ""
    symptoms: tuple[re.Pattern[str], ...] = ()

    def find(self, text: str) -> str | None:
        """The evidence line that matched, or None."""
        if any(p.search(text) for p in self.unless):
            return None
        if not all(p.search(text) for p in self.all):
            return None
        for pattern in self.any:
            match = pattern.search(text)
            if match:
                return _line_at(text, match.start())
        return None

    def find_symptom(self, text: str) -> str | None:
        """The line of the failure text (what was seen over HTTP) that matched a symptom, or None."""
        for pattern in self.symptoms:
            match = pattern.search(text)
            if match:
                return _line_at(text, match.start())
        return None


@dataclass(frozen=True)
class Diagnosis:
    """One matched signature: what it means, what to do, and the line that proved it."""

    id: str
    title: str
    remedy: str
    evidence: str
    layer: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    missing: str = ""  # a diagnosis from symptoms: the evidence that would confirm it, and how to add it

    def one_line(self) -> str:
        return f"[{self.id}] {self.title}"

    def as_dict(self) -> dict[str, str]:
        out = {"id": self.id, "title": self.title, "remedy": self.remedy, "evidence": self.evidence,
               "layer": self.layer}
        if self.missing:
            out["missing"] = self.missing
        return out


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end != -1 else len(text)].strip()[:300]


def _compile(patterns: Iterable[str], where: str) -> tuple[re.Pattern[str], ...]:
    out = []
    for raw in patterns:
        try:
            out.append(re.compile(raw, re.MULTILINE))
        except re.error as exc:
            raise ValueError(f"{where}: bad regex {raw!r}: {exc}") from None
    return tuple(out)


@dataclass(frozen=True)
class Catalog:
    signatures: tuple[Signature, ...]
    benign: tuple[re.Pattern[str], ...]

    def strip_benign(self, text: str) -> str:
        """Drop lines known to be harmless so they can never trigger a diagnosis."""
        if not self.benign:
            return text
        return "\n".join(line for line in text.splitlines() if not any(p.search(line) for p in self.benign))

    def diagnose(self, *texts: str, values: Mapping[str, str] | None = None, symptoms: str = "",
                 missing: str = "") -> list[Diagnosis]:
        """All matching signatures, most specific (highest priority) first.

        `symptoms`: the failure text alone, given when no log could be read; a signature not found in the
        texts but whose symptoms it shows is diagnosed from them; with no log, every diagnosis carries
        `missing` (the log that would confirm it and how to get it)."""
        text = self.strip_benign("\n".join(t for t in texts if t))
        found: list[tuple[int, Diagnosis]] = []
        for sig in self.signatures:
            evidence = sig.find(text)
            if evidence is None and symptoms and (seen := sig.find_symptom(symptoms)) is not None:
                evidence = f"seen over HTTP: {seen}"
            if evidence is None:
                continue
            remedy = sig.remedy
            for key, value in (values or {}).items():
                remedy = remedy.replace("{" + key + "}", value)
            found.append((sig.priority, Diagnosis(sig.id, sig.title, remedy, evidence, sig.layer,
                                                  missing=missing if symptoms else "")))
        found.sort(key=lambda pair: -pair[0])
        return [diagnosis for _, diagnosis in found]

    def by_id(self, signature_id: str) -> Signature:
        for sig in self.signatures:
            if sig.id == signature_id:
                return sig
        raise KeyError(signature_id)


def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    signatures = []
    seen: set[str] = set()
    for index, raw in enumerate(data.get("signature", [])):
        where = f"{path.name}: signature[{index}]"
        unknown = set(raw) - {"id", "title", "remedy", "any", "all", "unless", "priority", "layer", "seen",
                                   "symptoms"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        if raw["id"] in seen:
            raise ValueError(f"{where}: duplicate id {raw['id']!r}")
        seen.add(raw["id"])
        signatures.append(
            Signature(
                id=raw["id"],
                title=raw["title"],
                remedy=raw.get("remedy", ""),
                any=_compile(raw["any"], where),
                all=_compile(raw.get("all", ()), where),
                unless=_compile(raw.get("unless", ()), where),
                priority=int(raw.get("priority", 50)),
                layer=raw.get("layer", ""),
                seen=raw.get("seen", ""),
                symptoms=_compile(raw.get("symptoms", ()), where),
            )
        )
    benign = _compile(data.get("benign", {}).get("lines", ()), f"{path.name}: benign")
    return Catalog(tuple(signatures), benign)


@cache
def default_catalog() -> Catalog:
    return load_catalog()


def diagnose(*texts: str, values: Mapping[str, str] | None = None, symptoms: str = "",
             missing: str = "") -> list[Diagnosis]:
    """Diagnose with the built-in catalog."""
    return default_catalog().diagnose(*texts, values=values, symptoms=symptoms, missing=missing)
