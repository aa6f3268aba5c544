"""The diagnosis catalog: signatures of failures (`catalog.toml`), matched against failure text (logs,
journals, error messages).

The catalog is data, not code: adding a failure mode is adding a table. A signature may also name `symptoms`:
what the plugin itself saw over HTTP (in the failure text) that points at it when no log was read (a server
attached by URL); such a diagnosis says which evidence is missing and how to add it. How the matches of one
failure become one diagnosis per root cause is diagnosis/found.py's.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pytest_dflash.evidence.diagnosis.found import MODES, Diagnosis, fold

CATALOG_PATH = Path(__file__).with_name("catalog.toml")
_KEYS = {"id", "title", "remedy", "any", "all", "unless", "priority", "layer", "seen", "symptoms", "folds",
         "consequence", *(f"remedy_{mode}" for mode in MODES)}


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
    # the ids of signatures that describe the same event, less specifically: folded into this one
    folds: tuple[str, ...] = ()
    # what a failure looks like downstream (a crash, a dropped connection): folded into the cause when one is
    # found beside it; said only when nothing explains it
    consequence: bool = False
    # the remedy where the default one cannot be followed: "attach" (by URL, no host access), "container",
    # "provisioned" (the run starts the service from its profile's command)
    remedies: Mapping[str, str] | None = None

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

    def remedy_for(self, mode: str) -> str:
        """The remedy that fits how the service is run (`mode`: one of MODES, or '' for the default)."""
        return (self.remedies or {}).get(mode) or self.remedy


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

    def matches(self, *texts: str, values: Mapping[str, str] | None = None, symptoms: str = "",
                missing: str = "", mode: str = "") -> list[tuple[Signature, Diagnosis]]:
        """Every matching signature with its diagnosis, most specific (highest priority) first, unfolded.

        `symptoms`: the failure text alone, given when no log could be read; a signature not found in the
        texts but whose symptoms it shows is diagnosed from them; with no log, every diagnosis carries
        `missing` (the log that would confirm it and how to get it). `mode`: how the service is run, which
        picks the remedy (Signature.remedy_for)."""
        text = self.strip_benign("\n".join(t for t in texts if t))
        found: list[tuple[Signature, Diagnosis]] = []
        for sig in self.signatures:
            evidence = sig.find(text)
            if evidence is None and symptoms and (seen := sig.find_symptom(symptoms)) is not None:
                evidence = f"seen over HTTP: {seen}"
            if evidence is None:
                continue
            remedy = sig.remedy_for(mode)
            for key, value in (values or {}).items():
                remedy = remedy.replace("{" + key + "}", value)
            found.append((sig, Diagnosis(sig.id, sig.title, remedy, evidence, sig.layer,
                                         missing=missing if symptoms else "")))
        found.sort(key=lambda pair: -pair[0].priority)
        return found

    def diagnose(self, *texts: str, values: Mapping[str, str] | None = None, symptoms: str = "",
                 missing: str = "", mode: str = "") -> list[Diagnosis]:
        """One diagnosis per root cause, cause before consequence (`matches`, then found.fold)."""
        found = self.matches(*texts, values=values, symptoms=symptoms, missing=missing, mode=mode)
        return fold([(sig.id, sig.folds, sig.consequence, diagnosis) for sig, diagnosis in found])

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
        unknown = set(raw) - _KEYS
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
                folds=tuple(raw.get("folds", ())),
                consequence=bool(raw.get("consequence", False)),
                remedies={mode: raw[f"remedy_{mode}"] for mode in MODES if f"remedy_{mode}" in raw} or None,
            )
        )
    for sig in signatures:
        unknown_folds = set(sig.folds) - seen
        if unknown_folds:
            raise ValueError(f"{path.name}: {sig.id} folds unknown ids {sorted(unknown_folds)}")
    benign = _compile(data.get("benign", {}).get("lines", ()), f"{path.name}: benign")
    return Catalog(tuple(signatures), benign)


@cache
def default_catalog() -> Catalog:
    return load_catalog()


def diagnose(*texts: str, values: Mapping[str, str] | None = None, symptoms: str = "",
             missing: str = "", mode: str = "") -> list[Diagnosis]:
    """Diagnose with the built-in catalog: one diagnosis per root cause, cause first."""
    return default_catalog().diagnose(*texts, values=values, symptoms=symptoms, missing=missing, mode=mode)
